#include "grad_stager.h"

#include <stdexcept>
#include <string>

namespace pslab {

GradStager::GradStager(Backend& be, const float* dev, float* host, std::size_t P, std::size_t min_floats, GradListener& next)
    : be_(be), dev_(dev), host_(host), P_(P), min_floats_(min_floats < 1 ? 1 : min_floats), next_(next), queued_lo_(P) {
  copies_.reserve(P / min_floats_ + 2);  // a step's copies: no allocation per step
}

void GradStager::start() {
  if (passed_ != copies_.size())
    throw std::logic_error("GradStager: a step started before the last one's copies were passed on (no ready(0)?)");
  queued_lo_ = P_;
  copies_.clear();
  passed_ = 0;
}

void GradStager::ready(std::size_t lo) {
  if (lo > queued_lo_)
    throw std::logic_error("GradStager: ready(" + std::to_string(lo) + ") after ready(" + std::to_string(queued_lo_) +
                           ") in one step (start() not called?)");
  if (lo < queued_lo_ && (queued_lo_ - lo >= min_floats_ || lo == 0)) {
    const Backend::Ticket t = be_.download_async(host_ + lo, dev_ + lo, (queued_lo_ - lo) * sizeof(float));
    copies_.emplace_back(lo, t);
    queued_lo_ = lo;
  }
  pass_landed(/*wait*/ lo == 0);
}

void GradStager::pass_landed(bool wait) {
  while (passed_ < copies_.size() && be_.landed(copies_[passed_].second, wait)) next_.ready(copies_[passed_++].first);
}

}  // namespace pslab
