#include <stdexcept>
#include <string>

#include "elementwise.h"

namespace pslab::math {

Program& Program::op(OpCode code, int dst, int x, int y, Scalar a, Scalar b) {
  if (n_ops == kMaxOps) throw std::logic_error("math::Program: more than " + std::to_string(kMaxOps) + " ops");
  for (int r : {dst, x, y})
    if (r < 0 || r >= kMaxRegisters)
      throw std::logic_error("math::Program: register " + std::to_string(r) + " is not in [0, " +
                             std::to_string(kMaxRegisters) + ")");
  for (int slot : {a.slot, b.slot})
    if (slot < -1 || slot >= kMaxLive)
      throw std::logic_error("math::Program: live scalar " + std::to_string(slot) + " is not in [0, " +
                             std::to_string(kMaxLive) + ")");
  ops[n_ops++] = Op{code, std::uint8_t(dst), std::uint8_t(x), std::uint8_t(y), a.value, b.value,
                    std::int8_t(a.slot), std::int8_t(b.slot)};
  if (dst < arrays) outputs |= 1u << dst;
  return *this;
}

void Program::check_live() const {
  if (live) return;
  for (int o = 0; o < n_ops; ++o)
    if (ops[o].live_a >= 0 || ops[o].live_b >= 0)
      throw std::logic_error("math::Program: op " + std::to_string(o) + " reads a live scalar, but the program's live is null");
}

}  // namespace pslab::math
