// Deterministic random numbers from a seed, identical on every platform.
//
// splitmix64 (Steele, Lea & Flood) is specified bit for bit, unlike the standard library's
// distributions, so a run is reproducible from its config wherever it runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace pslab {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  // A stream derived from a seed and any number of labels (epoch, rank, layer...), so that
  // independent uses of one seed do not share numbers.
  static Rng derive(std::uint64_t seed, std::initializer_list<std::uint64_t> labels) {
    Rng r(seed);
    for (std::uint64_t l : labels) r.state_ = r.next() ^ (l * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
    return Rng(r.next());
  }

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), unbiased (rejection of the short last interval).
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x;
    do x = next(); while (x >= limit);
    return x % n;
  }
  // Standard normal (Box-Muller; one value per call, the second is discarded for simplicity).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Exponential with the given mean.
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  std::uint64_t state_;
};

}  // namespace pslab
