// The parameter-server client (ps/client.h) against fake servers that answer with the wrong
// message, or answer twice: what it takes for an answer.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "expect.h"
#include "harness.h"
#include "ps/client.h"
#include "run/config.h"
#include "run/setup.h"

using namespace pslab;
using test::expect_refused;

namespace {

// Defect: PsClient::bye() and shutdown() took any reply but an Error as done.
TEST(Client, ByeAndShutdownWantAnAckFromEveryServer) {
  ExperimentConfig cfg = test::small_config("asp", 1, 1);
  const auto transport = comm::make_transport("tcp");
  const std::string ep = transport->local_address("fake-server");
  auto listener = transport->listen(ep);
  std::thread fake([&] {  // answers Hello with Welcome, then anything else with a PushAck
    wire::Encoder enc;
    comm::Message m;
    comm::PeerId from;
    for (int i = 0; i < 3 && listener->recv(m, from, comm::after(std::chrono::seconds(10))); ++i) {
      std::string why;
      const auto h = wire::decode(m.header(), why);
      const std::size_t P = count_params(model_spec(cfg));
      const wire::Body reply = std::holds_alternative<wire::Hello>(h->body)
                                   ? wire::Body(wire::Welcome{0, 1, 0, P, 1, "asp", 0})
                                   : wire::Body(wire::PushAck{0, 0});
      listener->send(from, enc.encode(wire::Header{wire::kServer, 0, reply}));
    }
  });
  PsClient c(*transport, {ep}, client_options(cfg, wire::Role::worker, 0));
  c.connect();
  expect_refused([&] { c.bye(0); }, "answered Bye with PushAck",
                 "a PushAck was taken for the Ack of Bye");
  expect_refused([&] { c.shutdown(); }, "answered Shutdown with PushAck",
                 "a PushAck was taken for the Ack of Shutdown");
  fake.join();
}

// Defect (CI, launcher.CutConnections): an evaluator whose connection was cut said Hello again
// during a progress poll that its answer then ended; its next Pull left after that Hello, yet
// went again once the Welcome came, and the second answer (to a Pull of the same clock 0) was
// taken by the next progress poll: "answered a progress-only Pull with a payload". A request
// that left after the Hello goes once; an answer to an earlier request is skipped.
TEST(Client, AnEvaluatorSendsNothingTwiceAfterAHelloAgainAndSkipsAnswersToEarlierRequests) {
  ExperimentConfig cfg = test::small_config("asp", 1, 1);
  const std::size_t P = count_params(model_spec(cfg));
  const auto transport = comm::make_transport("tcp");
  const std::string ep = transport->local_address("fake-server");
  auto listener = transport->listen(ep);
  std::vector<float> theta(P);
  for (std::size_t i = 0; i < P; ++i) theta[i] = float(i) * 0.5f;
  std::atomic<bool> done{false};
  int hellos = 0, pulls = 0, polls = 0;
  std::thread fake([&] {
    wire::Encoder enc;
    comm::Message m;
    comm::PeerId from;
    const auto reply = [&](const wire::Body& b, comm::OutPayload payload = {}) {
      listener->send(from, enc.encode(wire::Header{wire::kServer, 0, b}), payload);
    };
    const auto theta_reply = [&](long clock) {
      reply(wire::PullReply{clock, 1, 0, 0, 0, false, wire::checksum(theta.data(), P), 0, P, 0, P * sizeof(float)},
            comm::OutPayload{theta.data(), P * sizeof(float)});
    };
    while (!done) {
      if (!listener->recv(m, from, comm::after(std::chrono::milliseconds(50)))) continue;
      std::string why;
      const auto h = wire::decode(m.header(), why);
      if (std::holds_alternative<wire::Hello>(h->body)) {
        if (++hellos == 1) reply(wire::Welcome{0, 1, 0, P, 1, "asp", 0, 0});  // the second: answered with the Pull
      } else if (const auto* p = std::get_if<wire::Pull>(&h->body); p && p->progress_only) {
        if (++polls == 1) reply(wire::Error{wire::ErrorCode::unknown_peer, "a Beat on a connection cut and made again"});
        reply(wire::PullReply{p->clock, 1, 0, 0, 0, false, 0, 0, 0, 0, 0});
      } else if (p) {
        if (++pulls == 1) reply(wire::Welcome{0, 1, 0, P, 1, "asp", 1, 0});  // the Hello again, then its Pull
        theta_reply(p->clock);
        theta_reply(p->clock);  // answered twice (as a Pull sent again would be)
      }
    }
  });
  PsClient c(*transport, {ep}, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  c.connect();
  c.progress();  // answered unknown_peer (a Hello again goes), and answered
  std::vector<float> got(P);
  c.pull(0, got.data());  // leaves after the Hello: the Welcome comes, it does not go again
  EXPECT_EQ(got, theta);
  try {
    c.progress();  // the second answer to the Pull comes first: skipped
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an answer to the Pull was taken for the progress poll's: " << e.what();
  }
  done = true;
  fake.join();
  EXPECT_EQ(hellos, 2);
  EXPECT_EQ(pulls, 1) << "the Pull went again though it left after the Hello again";
  EXPECT_EQ(polls, 2);
  EXPECT_EQ(c.reconnects(), 1);
  EXPECT_EQ(c.stale_replies(), 1);
}

// Defect: the worker took a Welcome's clock as its own unbounded; a server (a key holder) that
// said 10^12 had it push empty batches up to there in catch_up(), one round trip each.
TEST(Client, AWelcomeThatPutsTheWorkerOutsideTheRunsStepsIsRefused) {
  ExperimentConfig cfg = test::small_config("asp", 1, 1);
  const std::size_t P = count_params(model_spec(cfg));
  const long total = total_steps(cfg, steps_per_epoch(cfg, cfg.cluster.workers));
  ASSERT_GT(total, 0);
  const auto transport = comm::make_transport("tcp");
  const std::string ep = transport->local_address("fake-server");
  auto listener = transport->listen(ep);
  std::atomic<long> clock{0};
  std::atomic<bool> done{false};
  std::thread fake([&] {  // answers every Hello with a Welcome at `clock`
    wire::Encoder enc;
    comm::Message m;
    comm::PeerId from;
    while (!done) {
      if (!listener->recv(m, from, comm::after(std::chrono::milliseconds(50)))) continue;
      std::string why;
      const auto h = wire::decode(m.header(), why);
      if (h && std::holds_alternative<wire::Hello>(h->body))
        listener->send(from, enc.encode(wire::Header{wire::kServer, 0, wire::Welcome{0, 1, 0, P, 1, "asp", 0, clock}}));
    }
  });
  for (const long bad : {total + 1, -1L, 1000000000000L}) {
    clock = bad;
    PsClient c(*transport, {ep}, client_options(cfg, wire::Role::worker, 0));
    expect_refused([&] { c.connect(); }, "says worker 0 is at clock " + std::to_string(bad) + ", outside the run's " +
                                             std::to_string(total) + " steps",
                   "a Welcome's clock outside the run's steps was taken");
  }
  clock = total;  // the last step's push was applied: the worker is done
  PsClient c(*transport, {ep}, client_options(cfg, wire::Role::worker, 0));
  c.connect();
  EXPECT_EQ(c.catch_up().clock, total);
  done = true;
  fake.join();
}

// Defect (CI, launcher.Heartbeats): an evaluator whose progress poll met a stopped server said
// "silent for 1.0 s while progress waited for its reply": the request is named as a worker's
// are, a Pull (progress only).
TEST(Client, AProgressPollThatAStoppedServerLeavesUnansweredIsNamedAsAPull) {
  ExperimentConfig cfg = test::small_config("asp", 1, 1);
  cfg.cluster.heartbeat_s = 0.2;
  cfg.cluster.on_server_loss = "fail";
  const std::size_t P = count_params(model_spec(cfg));
  const auto transport = comm::make_transport("tcp");
  const std::string ep = transport->local_address("fake-server");
  auto listener = transport->listen(ep);
  std::atomic<bool> done{false};
  std::thread fake([&] {  // answers the Hello, then nothing (stopped)
    wire::Encoder enc;
    comm::Message m;
    comm::PeerId from;
    while (!done) {
      if (!listener->recv(m, from, comm::after(std::chrono::milliseconds(50)))) continue;
      std::string why;
      const auto h = wire::decode(m.header(), why);
      if (h && std::holds_alternative<wire::Hello>(h->body))
        listener->send(from, enc.encode(wire::Header{wire::kServer, 0, wire::Welcome{0, 1, 0, P, 1, "asp", 0, 0}}));
    }
  });
  PsClient c(*transport, {ep}, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  c.connect();
  expect_refused([&] { c.progress(); }, "while Pull (progress only) waited for its reply",
                 "a progress poll a stopped server never answered was not named");
  done = true;
  fake.join();
}

}  // namespace
