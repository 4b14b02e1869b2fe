// The parameter-server client (ps/client.h) against a fake server that answers with the wrong
// message: what it takes for an answer.
#include <gtest/gtest.h>

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

}  // namespace
