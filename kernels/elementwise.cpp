#include <stdexcept>
#include <string>

#include "elementwise.h"

namespace pslab::math {

Program& Program::op(OpCode code, int dst, int x, int y, float a, float b) {
  if (n_ops == kMaxOps) throw std::logic_error("math::Program: more than " + std::to_string(kMaxOps) + " ops");
  for (int r : {dst, x, y})
    if (r < 0 || r >= kMaxRegisters)
      throw std::logic_error("math::Program: register " + std::to_string(r) + " is not in [0, " +
                             std::to_string(kMaxRegisters) + ")");
  ops[n_ops++] = Op{code, std::uint8_t(dst), std::uint8_t(x), std::uint8_t(y), a, b};
  if (dst < arrays) outputs |= 1u << dst;
  return *this;
}

}  // namespace pslab::math
