// Progress lines on stderr for long runs: at most one every few seconds, plus one per epoch.
#pragma once

#include <string>

namespace pslab {

class Progress {
 public:
  struct Snapshot {
    long step, total_steps;
    double epoch;         // fractional
    double loss;          // recent mean training loss
    double test_acc;      // latest, < 0 if none yet
    double samples_per_s; // recent
    double elapsed_s;     // since run start
  };
  Progress(std::string who, bool enabled, double every_s = 5.0)
      : who_(std::move(who)), enabled_(enabled), every_s_(every_s) {}
  void update(const Snapshot& s);
  void epoch_done(double epoch, double test_loss, double test_acc);

 private:
  std::string who_;
  bool enabled_;
  double every_s_;
  double last_s_ = -1e9;
  Snapshot last_{};
};

}  // namespace pslab
