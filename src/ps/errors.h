// The two ways a push or pull can be refused by a shard; either way nothing has changed.
#pragma once

#include <stdexcept>

namespace pslab {

// A push or pull that breaks the rules (e.g. a second bsp push for one clock, or a clock that
// is not the worker's next). what() says what was expected.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A payload that cannot be used: bytes its codec cannot decode. what() says why.
class PayloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A payload whose checksum does not match the one its header carried (corrupted in transit).
class ChecksumError : public PayloadError {
 public:
  using PayloadError::PayloadError;
};

}  // namespace pslab
