// Blocking waits a signal can end, for a process that asks (libpslab_client in a Python worker:
// Ctrl-C must not wait out a 60 s timeout inside a C call). Off unless asked: the binaries stop
// on their own signals. catch_interrupts(): SIGINT and SIGTERM, where a handler of the process's
// own is installed (Python's), also set a flag; from then on the waits of the thread that asked
// look at it at least every kInterruptSliceMs and throw Interrupted, once per signal.
// Threading: catch_interrupts() once, on the thread whose waits end; the rest on any thread
// (other threads' waits are left as they were).
#pragma once

#include <chrono>
#include <stdexcept>

namespace pslab::comm {

struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int kInterruptSliceMs = 100;

void catch_interrupts();

// The longest this thread's wait may block between looks at the flag: kInterruptSliceMs where
// interrupts are caught on it, else `wanted` (milliseconds, as given).
long interrupt_slice_ms(long wanted);

// Throws Interrupted ("interrupted by SIGINT") once a caught signal came, on the thread that asked.
void throw_if_interrupted();
// Forgets a signal that came before now (between calls: the caller's to act on, not a wait's).
void forget_interrupt();

}  // namespace pslab::comm
