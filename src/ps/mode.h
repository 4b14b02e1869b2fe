// The consistency model of a run: how updates from the workers meet the parameters.
//   allreduce  synchronous all-reduce of gradients, a full replica per worker, no servers
//   bsp        servers average the W pushes of a clock and apply them once
//   ssp:s      servers apply pushes on arrival; a worker at clock c is served a pull only
//              when the slowest worker has clock >= c - s
//   asp        servers apply pushes on arrival; pulls are never held
#pragma once

#include <string>

namespace pslab {

struct Mode {
  enum class Kind { allreduce, bsp, ssp, asp };
  Kind kind = Kind::bsp;
  int staleness = 0;  // ssp only

  // Parses "allreduce", "bsp", "asp" or "ssp:<s>" (s >= 0); throws std::invalid_argument
  // saying what was expected.
  static Mode parse(const std::string& text);
  std::string str() const;
  bool uses_servers() const { return kind != Kind::allreduce; }
  bool operator==(const Mode&) const = default;
};

}  // namespace pslab
