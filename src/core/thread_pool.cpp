#include "lowbit/core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

namespace lowbit {

struct ThreadPool::Job {
  const std::function<void(size_t, size_t)>* fn;
  size_t n;
  size_t chunk;
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
};

namespace {
thread_local bool t_inside_pool = false;
}

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(Job& job) {
  for (;;) {
    const size_t begin = job.next.fetch_add(job.chunk);
    if (begin >= job.n) return;
    const size_t end = std::min(job.n, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.next.store(job.n);
    }
  }
}

void ThreadPool::worker_loop() {
  t_inside_pool = true;
  size_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      if (!job) continue;  // woke after the job finished and its caller returned
      ++active_;
    }
    run_chunks(*job);
    {
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  if (workers_.empty() || t_inside_pool || n <= grain) {
    fn(0, n);
    return;
  }
  // About four chunks per thread balances uneven chunks without much scheduling traffic.
  const size_t chunk = std::max(grain, (n + 4 * size() - 1) / (4 * size()));
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = chunk;
  {
    std::lock_guard lock(mutex_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  t_inside_pool = true;
  run_chunks(job);
  t_inside_pool = false;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    job_ = nullptr;
  }
  if (job.error) std::rethrow_exception(job.error);
}

namespace {
size_t g_default_threads = 0;
}

void set_default_threads(size_t threads) { g_default_threads = threads; }

ThreadPool& default_pool() {
  static ThreadPool pool(g_default_threads);
  return pool;
}

}  // namespace lowbit
