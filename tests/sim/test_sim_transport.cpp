// The virtual cluster's transport (src/sim/sim_transport.h): a message lands after its link's
// latency and bandwidth, messages on one link keep their order and queue behind each other, a
// server's listener takes payloads one at a time at its apply rate, and a receive waits in
// simulated time until its deadline.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/sim_transport.h"

using namespace pslab;
using namespace pslab::sim;
using namespace std::chrono_literals;

namespace {

Costs costs() {
  Costs c;
  c.latency_s = 1e-3;       // 1 ms
  c.bytes_per_s = 1e6;      // 1 byte per µs
  c.apply_bytes_per_s = 5e5;  // 2 µs per payload byte
  return c;
}

std::span<const std::byte> bytes(const std::string& s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }
std::string text(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

}  // namespace

TEST(SimTransport, AMessageTakesItsLinksLatencyAndBandwidthAndKeepsItsOrder) {
  Scheduler s;
  SimTransport net(s, costs());
  std::vector<std::pair<std::string, double>> got;
  s.spawn("listener", [&] {
    auto l = net.listen("sim://a");
    comm::Message m;
    comm::PeerId from;
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(l->recv(m, from, s.now() + 1s));
      got.emplace_back(text(m.header()) + "+" + std::to_string(m.payload().size()), s.seconds() * 1e6);
    }
    EXPECT_FALSE(l->recv(m, from, s.now() + 5ms)) << "nothing more comes";
    EXPECT_DOUBLE_EQ(s.seconds() * 1e6, got.back().second + 5000);
    // The reply goes back over the peer's own link.
    const std::string payload(500, 'x');
    EXPECT_TRUE(l->send(from, bytes("reply"), comm::OutPayload{payload.data(), payload.size()}));
  });
  s.spawn("sender", [&] {
    auto c = net.connect({"sim://a"});
    const std::string big(3000, 'b');
    c->send(0, bytes("big"), comm::OutPayload{big.data(), big.size()}, {});  // 3003 bytes: 3003 µs on the link
    c->send(0, bytes("small"), {}, {});                                      // 5 bytes, behind it
    comm::Message m;
    std::size_t from = 99;
    ASSERT_TRUE(c->recv(m, from, s.now() + 1s));
    EXPECT_EQ(from, 0u);
    EXPECT_EQ(text(m.header()), "reply");
    got.emplace_back("reply", s.seconds() * 1e6);
  });
  s.run();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, "big+3000");
  EXPECT_NEAR(got[0].second, 3003 + 1000, 1e-6);
  EXPECT_EQ(got[1].first, "small+0");
  EXPECT_NEAR(got[1].second, 3003 + 5 + 1000, 1e-6) << "queued behind the big one on the same link";
  EXPECT_NEAR(got[2].second, 4008 + 5000 + 505 + 1000, 1e-6);
}

TEST(SimTransport, AServerTakesPayloadsOneAtATimeAtItsApplyRate) {
  Scheduler s;
  SimTransport net(s, costs());
  net.apply_at("sim://server0");
  std::vector<double> at_us;
  s.spawn("server", [&] {
    auto l = net.listen("sim://server0");
    comm::Message m;
    comm::PeerId from;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(l->recv(m, from, s.now() + 1s));
      at_us.push_back(s.seconds() * 1e6);
    }
  });
  for (int w = 0; w < 2; ++w)
    s.spawn("worker " + std::to_string(w), [&] {
      auto c = net.connect({"sim://server0"});
      const std::string grad(100, 'g');
      c->send(0, bytes("h"), comm::OutPayload{grad.data(), grad.size()}, {});  // lands at 101 + 1000 µs
    });
  s.spawn("evaluator", [&] {
    auto c = net.connect({"sim://server0"});
    c->send(0, bytes("poll"), {}, {});  // no payload: no apply time, but it queues behind the pushes
  });
  s.run();
  // Both pushes land at 1101 µs: the first is taken at 1101 + 200, the second 200 later; the poll
  // (landed at 1004) went first, as it came first.
  ASSERT_EQ(at_us.size(), 3u);
  EXPECT_NEAR(at_us[0], 1004, 1e-3);
  EXPECT_NEAR(at_us[1], 1301, 1e-3);
  EXPECT_NEAR(at_us[2], 1501, 1e-3);
}

TEST(SimTransport, AMessageSentBeforeItsListenerExistsWaitsForIt) {
  Scheduler s;
  SimTransport net(s, costs());
  std::string got;
  s.spawn("early", [&] { net.connect({"sim://late"})->send(0, bytes("hello"), {}, {}); });
  s.spawn("late", [&] {
    s.wait_until(s.now() + 1s);
    auto l = net.listen("sim://late");
    comm::Message m;
    comm::PeerId from;
    ASSERT_TRUE(l->recv(m, from, s.now()));
    got = text(m.header());
    EXPECT_THROW(net.listen("sim://late"), std::runtime_error) << "an address in use";
  });
  s.run();
  EXPECT_EQ(got, "hello");
}
