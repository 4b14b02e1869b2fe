// The run's key: what authenticates the processes of one run to each other. One CURVE key pair
// (ZeroMQ's elliptic-curve security: Curve25519 key exchange, every message encrypted and
// authenticated), made afresh by the launcher for each run and written to a file of mode 0600
// in the run directory; every process of the run reads it (--auth-key FILE). A listener serves
// with it and accepts only peers that prove they hold it too (comm::Transport::authenticate).
// Whoever can read the file can join the run: the same user, as for the run's other files.
#pragma once

#include <string>

namespace pslab::comm {

struct RunKey {
  std::string public_key, secret_key;  // Z85 text, 40 characters each
};

// A new random key pair.
RunKey make_run_key();
// Writes `key` to `path` (created with mode 0600; an existing file is refused). Throws naming
// the path and why.
void write_run_key(const RunKey& key, const std::string& path);
// Reads a key written by write_run_key. Throws naming the path and what is wrong: missing,
// readable by group or others, not a key.
RunKey read_run_key(const std::string& path);

}  // namespace pslab::comm
