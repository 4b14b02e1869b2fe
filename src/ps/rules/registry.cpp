// The consistency rules pslab knows: cluster.mode -> rule. Adding one: its file beside these,
// a line here, its tests (tests/test_consistency.cpp) and a README line.
#include "ps/rules/rule.h"

namespace pslab {

std::unique_ptr<ConsistencyRule> make_bsp(const std::string&);
std::unique_ptr<ConsistencyRule> make_ssp(const std::string&);
std::unique_ptr<ConsistencyRule> make_asp(const std::string&);
std::unique_ptr<ConsistencyRule> make_dcasgd(const std::string&);
std::unique_ptr<ConsistencyRule> make_local(const std::string&);
std::unique_ptr<ConsistencyRule> make_easgd(const std::string&);

Registry<ConsistencyRule>& rule_registry() {
  static Registry<ConsistencyRule> r("consistency rule", {
      {"bsp", "bsp", "average the W pushes of a clock, apply once; pulls wait for the clock", false, make_bsp},
      {"ssp", "ssp:<s>", "apply each push; a pull waits until the slowest worker is <= s clocks behind", true, make_ssp},
      {"asp", "asp", "apply each push; pulls never wait", false, make_asp},
      {"dcasgd", "dcasgd:<lambda>", "asp with each gradient corrected for the updates it missed (delay-compensated)", true,
       make_dcasgd},
      {"local", "local:<H>", "local SGD: H steps on each worker's own model, then the servers average the models", true,
       make_local},
      {"easgd", "easgd:<alpha>", "elastic averaging: every cluster.sync_every steps a worker and the servers' centre "
       "move alpha x their difference toward each other", true, make_easgd},
  });
  return r;
}

std::string workers_below(const ShardView& s, long clock) {
  std::string who;
  for (int r = 0; r < s.workers(); ++r) {
    if (!s.counts(r)) continue;
    const long c = s.clocks[std::size_t(r)];
    if (c < clock) who += (who.empty() ? "" : ", ") + ("worker " + std::to_string(r) + " (clock " + std::to_string(c) + ")");
  }
  return who.empty() ? "nobody" : who;
}

}  // namespace pslab
