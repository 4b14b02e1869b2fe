// Real processes on 127.0.0.1: the pslab_server and pslab_worker binaries, started with free
// ports, waited for with a deadline, and killed (whole process groups) whatever happens.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Child processes, each in its own process group, killed with their groups at destruction.
class Processes {
 public:
  struct Proc {
    pid_t pid = -1;
    std::string name;
    fs::path log;
    int status = -1;  // exit code once reaped; 128 + signal if killed
  };
  explicit Processes(fs::path dir) : dir_(std::move(dir)) {}
  ~Processes() {
    for (auto& p : procs_)
      if (p.status < 0) {
        ::kill(-p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
      }
  }
  std::size_t spawn(const std::string& name, std::vector<std::string> argv) {
    Proc p;
    p.name = name;
    p.log = dir_ / (name + ".log");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      _exit(127);
    }
    ::setpgid(pid, pid);
    p.pid = pid;
    procs_.push_back(p);
    return procs_.size() - 1;
  }
  // Waits for process i to exit; returns its exit code, or -1 after `timeout_s`.
  int wait(std::size_t i, double timeout_s) {
    Proc& p = procs_[i];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (p.status < 0 && std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid)
        p.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return p.status;
  }
  void kill(std::size_t i) { ::kill(-procs_[i].pid, SIGKILL); }
  std::string log(std::size_t i) const { return read_file(procs_[i].log); }

 private:
  fs::path dir_;
  std::vector<Proc> procs_;
};

class MultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // "Run/tcp": one directory, removed whole
    dir = fs::temp_directory_path() / ("pslab_mp_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir);
  }
  std::string write_config(const std::string& mode, int workers, int servers, double epochs, double timeout_s,
                           const std::string& transport = "tcp") {
    const fs::path p = dir / "config.toml";
    std::ofstream(p) << "name = \"mp\"\n[data]\nkind = \"logistic\"\ndim = 16\noutputs = 3\ntrain_samples = 2048\n"
                        "test_samples = 512\n[model]\nkind = \"linear\"\n[optimizer]\nlr = 0.5\n"
                        "[train]\nbatch = 16\nthreads = 1\nepochs = " << epochs
                     << "\n[cluster]\nmode = \"" << mode << "\"\nworkers = " << workers << "\nservers = " << servers
                     << "\ntimeout_s = " << timeout_s << "\ntransport = \"" << transport << "\"\n[eval]\ninterval_s = 0.2\n";
    return p.string();
  }
  // Server 0 of the config `cfg` on a free port of 127.0.0.1 (`server_flags` added to its
  // command line) and worker 0 of it, started as processes of `procs`: which they are, and the
  // server's address.
  struct ServerAndWorker {
    std::size_t server, worker;
    std::string ep;
  };
  static ServerAndWorker start_server_and_worker(Processes& procs, const std::string& cfg,
                                                 const std::vector<std::string>& server_flags = {}) {
    const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
    std::vector<std::string> server_argv = {PSLAB_SERVER_BIN, "-c", cfg, "--shard", "0", "--bind", ep};
    server_argv.insert(server_argv.end(), server_flags.begin(), server_flags.end());
    const auto server = procs.spawn("server0", server_argv);
    const auto worker = procs.spawn("worker0", {PSLAB_WORKER_BIN, "ps", "-c", cfg, "--rank", "0", "--servers", ep, "-q"});
    return {server, worker, ep};
  }

  fs::path dir;
};

class MultiProcessRun : public MultiProcess, public ::testing::WithParamInterface<std::string> {};

TEST_P(MultiProcessRun, PsRunFinishesCleanlyAndLearns) {
  const std::string transport = GetParam();
  const std::string cfg = write_config("ssp:1", 2, 2, 3, 30, transport);
  Processes procs(dir);
  std::vector<std::string> eps;
  for (int k = 0; k < 2; ++k)
    eps.push_back(transport == "tcp" ? "tcp://127.0.0.1:" + std::to_string(free_port())
                                     : "ipc://" + (dir / ("server" + std::to_string(k))).string());  // ipc, shm
  const std::string servers = eps[0] + "," + eps[1];
  std::vector<std::size_t> ids;
  for (int k = 0; k < 2; ++k)
    ids.push_back(procs.spawn("server" + std::to_string(k),
                              {PSLAB_SERVER_BIN, "-c", cfg, "--shard", std::to_string(k), "--bind", eps[std::size_t(k)],
                               "--metrics", (dir / ("metrics/server" + std::to_string(k) + ".jsonl")).string(),
                               "--wait-for-shutdown"}));
  for (int r = 0; r < 2; ++r)
    ids.push_back(procs.spawn("worker" + std::to_string(r), {PSLAB_WORKER_BIN, "ps", "-c", cfg, "--rank", std::to_string(r),
                                                             "--servers", servers, "-o", dir.string(), "-q"}));
  ids.push_back(procs.spawn("evaluator", {PSLAB_WORKER_BIN, "eval", "-c", cfg, "--servers", servers, "-o", dir.string(), "-q"}));
  for (std::size_t i : ids) EXPECT_EQ(procs.wait(i, 60), 0) << procs.log(i);

  const std::string out = procs.log(ids.back());
  const auto pos = out.find("final test accuracy: ");
  ASSERT_NE(pos, std::string::npos) << out;
  EXPECT_GT(std::stod(out.substr(pos + 21)), 0.9) << out;
  for (int k = 0; k < 2; ++k) {
    std::ifstream f(dir / ("metrics/server" + std::to_string(k) + ".jsonl"));
    std::string line, last;
    while (std::getline(f, line)) last = line;
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j["kind"], "server_final");
    EXPECT_EQ(j["pushes"], 2 * 3 * 64) << "2 workers x 3 epochs x 64 steps";
    EXPECT_EQ(j["bad_total"], 0);
    // Between a worker's pull at clock c and its push, the other worker (at clock >= c - s)
    // can push up to clock c + s + 1: at most 2s + 1 updates per other worker.
    long max_staleness = 0, counted = 0;
    for (const auto& [w, hist] : j["staleness_hist"].items())
      for (std::size_t s = 0; s < hist.size(); ++s)
        if (hist[s].get<long>() > 0) max_staleness = std::max(max_staleness, long(s)), counted += hist[s].get<long>();
    EXPECT_EQ(counted, 2 * 3 * 64) << "every push counted once on each shard";
    EXPECT_LE(max_staleness, 3) << "ssp:1 with 2 workers bounds staleness by (2s+1)(W-1)";
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessRun, ::testing::Values("tcp", "ipc", "shm"),
                         [](const auto& i) { return i.param; });

TEST_F(MultiProcess, AWorkerWhoseServerDiesFailsNamingIt) {
  const std::string cfg = write_config("asp", 1, 1, 100000, 1.0);
  Processes procs(dir);
  const auto [server, worker, ep] = start_server_and_worker(procs, cfg);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // training is under way
  ASSERT_EQ(procs.wait(worker, 0), -1) << "worker ended early: " << procs.log(worker);
  procs.kill(server);
  EXPECT_EQ(procs.wait(worker, 10), 1) << "the worker must fail, not hang";
  const std::string log = procs.log(worker);
  EXPECT_NE(log.find("server 0 at " + ep), std::string::npos) << log;
  EXPECT_NE(log.find("no reply to Push"), std::string::npos) << log;
}

TEST_F(MultiProcess, AMissingWorkerIsNamedByTheServerAtTheStartBarrier) {
  const std::string cfg = write_config("bsp", 2, 1, 1, 1.0);
  Processes procs(dir);
  const auto [server, worker, ep] = start_server_and_worker(procs, cfg);
  EXPECT_EQ(procs.wait(server, 10), 1);
  EXPECT_NE(procs.log(server).find("start barrier: waited 1 s for Hello from workers 1"), std::string::npos)
      << procs.log(server);
  EXPECT_EQ(procs.wait(worker, 10), 1);
  EXPECT_NE(procs.log(worker).find("no reply to Hello"), std::string::npos) << procs.log(worker);
}

TEST_F(MultiProcess, AServerWaitingForAShutdownThatNeverComesSaysSo) {
  const std::string cfg = write_config("asp", 1, 1, 1, 1.0);
  Processes procs(dir);
  const auto [server, worker, ep] = start_server_and_worker(procs, cfg, {"--wait-for-shutdown"});
  EXPECT_EQ(procs.wait(worker, 20), 0) << procs.log(worker);
  EXPECT_EQ(procs.wait(server, 10), 1) << "the server must give up, not wait forever";
  EXPECT_NE(procs.log(server).find("but no Shutdown came"), std::string::npos) << procs.log(server);
}

TEST_F(MultiProcess, APortInUseIsReportedWithTheAddress) {
  const std::string cfg = write_config("asp", 1, 1, 1, 30);
  Processes procs(dir);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  const auto first = procs.spawn("server0", {PSLAB_SERVER_BIN, "-c", cfg, "--shard", "0", "--bind", ep});
  for (int i = 0; i < 200 && procs.log(first).find("listening on") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (bound: a busy machine starts it late)
  ASSERT_NE(procs.log(first).find("listening on"), std::string::npos) << procs.log(first);
  const auto second = procs.spawn("server0b", {PSLAB_SERVER_BIN, "-c", cfg, "--shard", "0", "--bind", ep});
  EXPECT_EQ(procs.wait(second, 10), 1);
  EXPECT_NE(procs.log(second).find("cannot bind " + ep), std::string::npos) << procs.log(second);
  procs.kill(first);
}

}  // namespace
