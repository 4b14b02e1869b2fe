// A server's checkpoints of its shard (ps/checkpoint.h): written every checkpoint.every_s and
// when the server stops, however it stops; read back by --resume.
#include <cstdio>

#include "server.h"

namespace pslab {

void Server::resume_from(const std::string& path) {
  restore_state(read_checkpoint(path), "server " + std::to_string(opt_.shard) + ": cannot resume from " + path + ": ");
  std::fprintf(stderr, "server %d: resumed from %s at version %ld\n", opt_.shard, path.c_str(), state_->version());
}

void Server::restore_state(ShardCheckpoint c, const std::string& who) {
  if (c.shard != opt_.shard || c.num_shards != cfg_.cluster.servers)
    throw std::runtime_error(who + "it is shard " + std::to_string(c.shard) + " of " + std::to_string(c.num_shards) +
                             ", this server is shard " + std::to_string(opt_.shard) + " of " + std::to_string(cfg_.cluster.servers));
  if (c.config_hash != config_hash_)
    throw std::runtime_error(who + "it was written by a run with a different config (fingerprints differ)");
  for (std::size_t r = 0; r < c.lost.size() && r < said_bye_.size(); ++r) {
    said_bye_[r] = (c.lost[r] & kSaidBye) != 0;  // workers that had said Bye stay done
    c.lost[r] &= ~kSaidBye;
  }
  try {
    state_->restore(c);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(who + e.what());
  }
  barrier_open_ = true;  // the run started long ago: no start barrier
  const auto now = clock_.now();
  finished_ = 0;
  for (std::size_t r = 0; r < said_bye_.size(); ++r) {
    workers_.watch(r, true, now);
    if (!said_bye_[r] && !state_->dropped(int(r))) continue;
    workers_.finish(r);
    ++finished_;
  }
}

ShardCheckpoint Server::checkpoint_now() const {
  ShardCheckpoint c = state_->checkpoint();
  for (std::size_t r = 0; r < c.lost.size(); ++r) c.lost[r] |= said_bye_[r] ? kSaidBye : 0;
  c.shard = opt_.shard;
  c.num_shards = cfg_.cluster.servers;
  c.config_hash = config_hash_;
  return c;
}

void Server::restart_fresh() {
  barrier_open_ = true;  // the run started long ago: no start barrier
  const auto now = clock_.now();
  for (std::size_t r = 0; r < said_bye_.size(); ++r) workers_.watch(r, true, now);  // (one that finished: silent, dropped)
  std::fprintf(stderr, "server %d: restarted without a checkpoint (it died before writing one): from the run's initial θ; "
               "the updates of this shard so far are lost, counted as the workers rejoin\n", opt_.shard);
}

void Server::write_checkpoint_now(const char* why) {
  // A backup that has had no input from its primary holds the initial θ, not the shard (one
  // started in place of a server that died, not sent the shard yet): its file keeps what it held.
  if (!opt_.backup_of.empty() && applied_ == 0) return;
  const auto t0 = clock_.now();
  long version = 0;
  try {
    const ShardCheckpoint c = checkpoint_now();
    write_checkpoint(opt_.checkpoint_path, c);
    version = c.version;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "server %d: %s checkpoint not written: %s\n", opt_.shard, why, e.what());
    return;
  }
  if (!metrics_) return;
  metrics_->write({{"kind", "checkpoint"}, {"shard", opt_.shard}, {"why", why}, {"version", version},
                   {"ms", seconds_between(t0, clock_.now()) * 1e3}});
  metrics_->flush();
}

}  // namespace pslab
