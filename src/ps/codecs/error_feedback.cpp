// Error feedback (Seide et al. 2014; Karimireddy et al. 2019): a lossy codec's encoder keeps
// what it left out of a slice and adds it to the next one, so that nothing a worker computed
// is lost, only late: what was sent plus what is kept equals every gradient added up.
#include "ps/codecs/codec.h"

namespace pslab {
namespace {

class ErrorFeedback final : public PushCodec {
 public:
  explicit ErrorFeedback(std::unique_ptr<PushCodec> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::uint8_t wire_id() const override { return inner_->wire_id(); }
  std::size_t max_bytes(std::size_t n) const override { return inner_->max_bytes(n); }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    if (residual_.size() != n) residual_.assign(n, 0.0f), sent_.resize(n);
    for (std::size_t i = 0; i < n; ++i) residual_[i] += grad[i];  // what is owed, this push included
    const std::size_t bytes = inner_->encode(residual_.data(), n, out);
    inner_->decode({out, bytes}, n, sent_.data());  // what the server will apply
    for (std::size_t i = 0; i < n; ++i) residual_[i] -= sent_[i];
    return bytes;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    inner_->decode(payload, n, out);
  }
  const std::vector<float>* residual() const override { return &residual_; }

 private:
  std::unique_ptr<PushCodec> inner_;
  std::vector<float> residual_, sent_;  // one slice's (the codec object is one shard's)
};

}  // namespace

std::unique_ptr<PushCodec> with_error_feedback(std::unique_ptr<PushCodec> inner) {
  return std::make_unique<ErrorFeedback>(std::move(inner));
}

}  // namespace pslab
