#include "comm/run_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <zmq.h>

namespace pslab::comm {
namespace {

// The file: two lines, "public Z85" and "secret Z85".
constexpr const char* kPublic = "public ";
constexpr const char* kSecret = "secret ";

bool is_z85_key(const std::string& s) {
  std::uint8_t raw[32];
  return s.size() == 40 && zmq_z85_decode(raw, s.c_str()) != nullptr;
}

}  // namespace

RunKey make_run_key() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()) +
                             " (libzmq built without CURVE?)");
  return RunKey{pub, sec};
}

void write_run_key(const RunKey& key, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(path + ": cannot create the run's key file: " + std::strerror(errno));
  const std::string text = kPublic + key.public_key + "\n" + kSecret + key.secret_key + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  const int err = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error(path + ": cannot write the run's key file: " + std::strerror(err));
}

RunKey read_run_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error(path + ": cannot read the run's key file: " + std::strerror(errno));
  if (st.st_mode & 077)
    throw std::runtime_error(path + ": the run's key file is readable by others (mode " +
                             std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                             std::to_string(st.st_mode & 7) + "); it must be 0600");
  std::ifstream in(path);
  std::string line;
  RunKey k;
  while (std::getline(in, line)) {
    if (line.rfind(kPublic, 0) == 0) k.public_key = line.substr(std::strlen(kPublic));
    if (line.rfind(kSecret, 0) == 0) k.secret_key = line.substr(std::strlen(kSecret));
  }
  if (!is_z85_key(k.public_key) || !is_z85_key(k.secret_key))
    throw std::runtime_error(path + ": not a run key (two lines, \"public Z85\" and \"secret Z85\", 40 characters each)");
  return k;
}

}  // namespace pslab::comm
