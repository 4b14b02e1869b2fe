#include "comm/interrupt.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <thread>

namespace pslab::comm {
namespace {

std::atomic<int> g_signal{0};  // the caught signal not yet thrown, or 0
std::atomic<bool> g_catching{false};
std::thread::id g_thread;  // (written once, before g_catching)
struct sigaction g_previous[2];
constexpr int kSignals[2] = {SIGINT, SIGTERM};

void on_signal(int sig, siginfo_t* info, void* context) {
  g_signal.store(sig, std::memory_order_relaxed);
  for (int i = 0; i < 2; ++i) {  // then what was there: Python's (KeyboardInterrupt once the call returns)
    if (kSignals[i] != sig) continue;
    const struct sigaction& p = g_previous[i];
    if (p.sa_flags & SA_SIGINFO) p.sa_sigaction(sig, info, context);
    else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) p.sa_handler(sig);
  }
}

bool on_this_thread() {
  return g_catching.load(std::memory_order_acquire) && std::this_thread::get_id() == g_thread;
}

}  // namespace

void catch_interrupts() {
  if (g_catching.load()) return;
  g_thread = std::this_thread::get_id();
  for (int i = 0; i < 2; ++i) {
    struct sigaction now {};
    if (::sigaction(kSignals[i], nullptr, &g_previous[i]) != 0) continue;
    const bool handled = (g_previous[i].sa_flags & SA_SIGINFO) ||
                         (g_previous[i].sa_handler != SIG_DFL && g_previous[i].sa_handler != SIG_IGN);
    if (!handled) continue;  // (the default ends the process at once; ignored stays ignored)
    now.sa_sigaction = on_signal;
    now.sa_flags = SA_SIGINFO | (g_previous[i].sa_flags & SA_RESTART);
    sigemptyset(&now.sa_mask);
    ::sigaction(kSignals[i], &now, nullptr);
  }
  g_catching.store(true, std::memory_order_release);
}

void forget_interrupt() { g_signal.store(0); }

long interrupt_slice_ms(long wanted) {
  return on_this_thread() ? std::clamp<long>(wanted, 0, kInterruptSliceMs) : wanted;
}

void throw_if_interrupted() {
  if (!on_this_thread()) return;
  if (const int sig = g_signal.exchange(0)) throw Interrupted(sig == SIGINT ? "interrupted by SIGINT" : "interrupted by SIGTERM");
}

}  // namespace pslab::comm
