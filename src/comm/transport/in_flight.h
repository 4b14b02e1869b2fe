// Payloads a transport still references, for a sender that reuses its buffer (a worker's
// gradient): payload() makes an OutPayload whose release the transport calls when done;
// wait_idle() blocks until every one of them was released.
// Threading: payload() and wait_idle() on the sender's thread; release on any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>

#include "comm/interrupt.h"
#include "comm/transport/transport.h"

namespace pslab::comm {

class InFlight {
 public:
  OutPayload payload(const void* data, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
    return OutPayload{data, bytes, &InFlight::release, this};
  }
  // Blocks until no payload is referenced, or throws after `timeout` naming `what`.
  void wait_idle(std::chrono::milliseconds timeout, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return n_ == 0; }))
      throw std::runtime_error(std::to_string(n_) + " send(s) of " + what + " still not done after " +
                               std::to_string(timeout.count()) + " ms");
  }
  // The same, for payloads whose release the waiting thread must drive (a transport that lends
  // them releases them in its progress(), called here between short waits).
  template <typename Progress>
  void wait_idle(std::chrono::milliseconds timeout, const std::string& what, Progress progress) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      progress();
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::microseconds(100), [&] { return n_ == 0; })) return;
      lock.unlock();
      throw_if_interrupted();  // (a Python worker's Ctrl-C: comm/interrupt.h)
      if (std::chrono::steady_clock::now() >= deadline)
        throw std::runtime_error(std::to_string(count()) + " send(s) of " + what + " still not done after " +
                                 std::to_string(timeout.count()) + " ms");
    }
  }
  int count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  static void release(void*, void* hint) {
    auto* self = static_cast<InFlight*>(hint);
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      --self->n_;
    }
    self->cv_.notify_all();
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

}  // namespace pslab::comm
