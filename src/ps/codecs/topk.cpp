// topk:f: the ceil(f x n) entries of largest magnitude of a slice, as (index, value) pairs:
//   uint32 count | count x uint32 index | count x float32 value
// (4 + 8 k bytes: topk:0.01 pushes 2% of f32's bytes). The rest is left behind: with error
// feedback (cluster.error_feedback, on by default for topk) it is added to the next push.
// topk:1 sends every entry: the server applies f32's gradient, bit for bit.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <cstring>
#include <numeric>

#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class TopK final : public PushCodec {
 public:
  TopK(double fraction, std::string text) : f_(fraction), text_(std::move(text)) {}
  std::string name() const override { return "topk:" + text_; }
  std::uint8_t wire_id() const override { return 3; }
  std::size_t max_bytes(std::size_t n) const override { return 4 + 8 * keep(n); }
  bool wants_error_feedback() const override { return true; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    const std::size_t k = keep(n);
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    // The k largest |g| first (ties: the lower index; NaN as the largest, so that the order is
    // a strict weak ordering and the server refuses the push), in no particular order.
    const auto size = [&](std::uint32_t i) {
      const float x = std::abs(grad[i]);
      return std::isnan(x) ? std::numeric_limits<float>::infinity() : x;
    };
    if (k < n)
      std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(k), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
        const float x = size(a), y = size(b);
        return x > y || (x == y && a < b);
      });
    const std::uint32_t count = std::uint32_t(k);
    std::memcpy(out, &count, 4);
    std::memcpy(out + 4, order_.data(), 4 * k);
    for (std::size_t i = 0; i < k; ++i) std::memcpy(out + 4 + 4 * k + 4 * i, grad + order_[i], 4);
    return 4 + 8 * k;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    std::uint32_t count = 0;
    if (payload.size() >= 4) std::memcpy(&count, payload.data(), 4);
    if (payload.size() < 4 || count > n || payload.size() != 4 + 8 * std::size_t(count))
      throw PayloadError(name() + " payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats: not a count followed by that many (index, value) pairs");
    std::fill(out, out + n, 0.0f);
    for (std::size_t i = 0; i < count; ++i) {
      std::uint32_t at;
      std::memcpy(&at, payload.data() + 4 + 4 * i, 4);
      if (at >= n) throw PayloadError(name() + " payload names entry " + std::to_string(at) + " of " + std::to_string(n));
      std::memcpy(out + at, payload.data() + 4 + 4 * std::size_t(count) + 4 * i, 4);
    }
  }

 private:
  std::size_t keep(std::size_t n) const { return std::min(n, std::size_t(std::ceil(f_ * double(n)))); }
  double f_;
  std::string text_;
  std::vector<std::uint32_t> order_;  // reused
};

}  // namespace

std::unique_ptr<PushCodec> make_topk(const std::string& arg) {
  double f = -1;
  const auto [p, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), f);
  if (ec != std::errc() || p != arg.data() + arg.size() || arg.empty() || !(f > 0 && f <= 1))
    throw std::invalid_argument("the fraction kept must be a number in (0, 1], e.g. \"topk:0.01\"");
  return std::make_unique<TopK>(f, arg);
}

}  // namespace pslab
