// When the evaluator evaluates, with eval.every_epochs > 0: each time training has applied that
// many more epochs of samples (so that a curve has the same number of points however fast the
// run is), besides once at the start and once at the end. Otherwise every eval.interval_s.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <stop_token>

#include "core/clock.h"
#include "ps/client.h"

namespace pslab {

class EpochTicks {
 public:
  explicit EpochTicks(double every_epochs) : every_(every_epochs) {}
  bool on() const { return every_ > 0; }
  // Whether `epoch` (samples applied / training-set size) has reached the next tick; if so, the
  // tick after it is the next multiple of every_epochs past `epoch`.
  bool due(double epoch) {
    if (!on() || epoch + 1e-9 < next_) return false;
    next_ = (std::floor(epoch / every_ + 1e-9) + 1) * every_;
    return true;
  }

 private:
  double every_;
  double next_ = 0.0;
};

// PS modes: θ by an ungated pull of every shard, when it is due: every eval.interval_s (unless no
// update came since the last θ taken), or when the samples applied reach the next
// eval.every_epochs tick, and when training is done. Between
// θs the servers are asked only for their progress (headers, no θ) every kPoll, so that the end
// of training is seen within kPoll however long the interval. (The evaluator's, and that of an
// evaluator of the user's through libpslab_client.)
class ServerTicks {
 public:
  // `client` connected as the evaluator; `train_n`: the training set's samples.
  ServerTicks(RunClock& clock, PsClient& client, double interval_s, double every_epochs, double train_n)
      : clock_(clock), client_(client),
        interval_(std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(interval_s))),
        ticks_(every_epochs), train_n_(train_n), next_(clock.now()) {}
  // Waits until θ is due, then pulls it into theta (P floats); training_done: the last one.
  // A stop requested meanwhile throws std::runtime_error.
  PullResult next(float* theta, std::stop_token stop = {}) {
    const auto poll = std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(kPoll));
    while (true) {
      const PullResult p = client_.progress();
      bool due = p.training_done || ticks_.due(double(p.samples_applied) / train_n_);
      if (!due && !ticks_.on() && clock_.now() >= next_) {  // eval.interval_s: the tick has come, but θ as
        const bool unchanged = p.samples_applied == taken_ && p.max_version == taken_version_;  // last taken (no
        if (unchanged) next_ = std::max(next_ + interval_, clock_.now());  // update since: a slow start) is not
        else due = true;                                                    // taken again
      }
      if (due) {
        // Evaluation may take longer than the interval: never queue up missed ticks.
        next_ = std::max(next_ + interval_, clock_.now());
        PullResult r = client_.pull(0, theta);
        taken_ = r.samples_applied, taken_version_ = r.max_version;
        return r;
      }
      if (!clock_.sleep_until(ticks_.on() ? clock_.now() + poll : std::min(next_, clock_.now() + poll), stop))
        throw std::runtime_error("the evaluator stopped while it waited for the next θ");
    }
  }

 private:
  static constexpr double kPoll = 0.02;  // s between progress polls
  RunClock& clock_;
  PsClient& client_;
  RunClock::duration interval_;
  EpochTicks ticks_;
  double train_n_;
  RunClock::time_point next_;
  long taken_ = -1, taken_version_ = -1;  // the samples applied to the θ last taken (-1: none yet), its newest shard's version
};

}  // namespace pslab
