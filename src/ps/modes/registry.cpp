// The modes pslab knows: cluster.mode -> mode. Adding one: its file beside these, a line here,
// its tests (tests/ps/) and a line in docs/algorithms.md.
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>

#include "ps/modes/mode.h"

namespace pslab {

std::unique_ptr<Mode> make_allreduce(const std::string&);
std::unique_ptr<Mode> make_bsp(const std::string&);
std::unique_ptr<Mode> make_ssp(const std::string&);
std::unique_ptr<Mode> make_asp(const std::string&);
std::unique_ptr<Mode> make_dcasgd(const std::string&);
std::unique_ptr<Mode> make_local(const std::string&);
std::unique_ptr<Mode> make_easgd(const std::string&);

Registry<Mode>& mode_registry() {
  static Registry<Mode> r("mode", {
      {"allreduce", "allreduce", "all-reduce the gradients between the workers every step; no servers", false, make_allreduce},
      {"bsp", "bsp", "average the W pushes of a clock, apply once; pulls wait for the clock", false, make_bsp},
      {"ssp", "ssp:<s>", "apply each push; a pull waits until the slowest worker is <= s clocks behind", true, make_ssp, "2"},
      {"asp", "asp", "apply each push; pulls never wait", false, make_asp},
      {"dcasgd", "dcasgd:<lambda>", "asp with each gradient corrected for the updates it missed (delay-compensated)", true,
       make_dcasgd, "0.04"},
      {"local", "local:<H>", "local SGD: H steps on each worker's own model, then the servers average the models", true,
       make_local, "4"},
      {"easgd", "easgd:<alpha>", "elastic averaging: every cluster.sync_every steps a worker and the servers' centre "
       "move alpha x their difference toward each other", true, make_easgd, "0.2"},
  });
  return r;
}

const Mode& mode_of(const std::string& spec) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Mode>> made;
  std::lock_guard lock(mu);
  auto& m = made[spec];
  if (!m) {
    try {
      m = make_mode(spec);
    } catch (...) {
      made.erase(spec);
      throw;
    }
  }
  return *m;
}

void Mode::on_push(const PushInfo&, const ShardView&, ShardOps&) const {
  throw std::logic_error(name() + " has no servers: no shard takes pushes");
}
bool Mode::pull_ready(long, const ShardView&) const {
  throw std::logic_error(name() + " has no servers: no shard serves pulls");
}
std::string Mode::why_held(long, const ShardView&) const { return name() + " never holds a pull"; }

std::string workers_below(const ShardView& s, long clock) {
  std::string who;
  for (int r = 0; r < s.workers(); ++r) {
    if (!s.counts(r)) continue;
    const long c = s.clocks[std::size_t(r)];
    if (c < clock) who += (who.empty() ? "" : ", ") + ("worker " + std::to_string(r) + " (clock " + std::to_string(c) + ")");
  }
  return who.empty() ? "nobody" : who;
}

double mode_number(const std::string& text, const char* expected) {
  double x = 0;
  const char* e = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), e, x);
  if (ec != std::errc() || p != e || text.empty() || !std::isfinite(x)) throw std::invalid_argument(expected);
  return x;
}

long mode_integer(const std::string& text, const char* expected) {
  long x = 0;
  const char* e = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), e, x);
  if (ec != std::errc() || p != e || text.empty()) throw std::invalid_argument(expected);
  return x;
}

}  // namespace pslab
