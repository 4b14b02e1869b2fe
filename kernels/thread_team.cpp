#include "thread_team.h"

#include <stdexcept>
#include <string>

namespace pslab {

ThreadTeam::ThreadTeam(int size) {
  if (size < 1) throw std::invalid_argument("ThreadTeam: size " + std::to_string(size) + " < 1");
  for (int i = 1; i < size; ++i) threads_.emplace_back([this, i] { member(i); });
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadTeam::member(int index) {
  long seen = 0;
  while (true) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr e;
    try {
      (*job)(index);
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (e && !error_) error_ = e;
    if (--running_ == 0) done_.notify_one();
  }
}

void ThreadTeam::run(const std::function<void(int)>& fn) {
  if (threads_.empty()) return fn(0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    running_ = int(threads_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return running_ == 0; });
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace pslab
