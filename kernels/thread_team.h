// A fixed team of threads that runs one job on every member at once, for splitting one pass
// over memory (a shard's update) across cores: run(fn) calls fn(0), ..., fn(size() - 1),
// fn(0) on the calling thread and the others on the team's threads, and returns when all have
// (rethrowing the first exception). A team of size 1 starts no thread.
// Threading: one caller of run() at a time.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pslab {

class ThreadTeam {
 public:
  explicit ThreadTeam(int size);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return int(threads_.size()) + 1; }
  void run(const std::function<void(int)>& fn);

 private:
  void member(int index);

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  long generation_ = 0;  // one per run()
  int running_ = 0;      // members still in the current job
  bool quit_ = false;
  std::exception_ptr error_;
};

}  // namespace pslab
