// The thread team (kernels/thread_team.h) that splits one pass over memory (a shard's update) across cores.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "thread_team.h"

using namespace pslab;

namespace {

TEST(ThreadTeam, RunsEveryMemberAndRethrowsAFailure) {
  ThreadTeam team(3);
  std::vector<int> ran(3, 0);
  for (int i = 0; i < 100; ++i) team.run([&](int t) { ++ran[std::size_t(t)]; });
  EXPECT_EQ(ran, (std::vector<int>{100, 100, 100}));
  EXPECT_THROW(team.run([](int t) { if (t == 2) throw std::runtime_error("member 2"); }), std::runtime_error);
  team.run([&](int t) { ++ran[std::size_t(t)]; });  // still works after a failure
  EXPECT_EQ(ran, (std::vector<int>{101, 101, 101}));
}

}  // namespace
