#include "ps/mode.h"

#include <charconv>
#include <stdexcept>

namespace pslab {

Mode Mode::parse(const std::string& text) {
  if (text == "allreduce") return {Kind::allreduce, 0};
  if (text == "bsp") return {Kind::bsp, 0};
  if (text == "asp") return {Kind::asp, 0};
  if (text.rfind("ssp:", 0) == 0) {
    int s = -1;
    const char* b = text.data() + 4;
    const char* e = text.data() + text.size();
    auto [p, ec] = std::from_chars(b, e, s);
    if (ec == std::errc() && p == e && b != e && s >= 0) return {Kind::ssp, s};
  }
  throw std::invalid_argument("\"" + text +
                              "\" is not a mode: expected \"allreduce\", \"bsp\", \"asp\" or "
                              "\"ssp:<s>\" with s a staleness bound >= 0, e.g. \"ssp:2\"");
}

std::string Mode::str() const {
  switch (kind) {
    case Kind::allreduce: return "allreduce";
    case Kind::bsp: return "bsp";
    case Kind::ssp: return "ssp:" + std::to_string(staleness);
    case Kind::asp: return "asp";
  }
  return "?";
}

}  // namespace pslab
