// A fixed pool of worker threads shared by every kernel: no thread is created per call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lowbit {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads);  // total threads including the caller; 0 = hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain`, on the pool and the calling thread, and
  // returns when all chunks are done. The first exception thrown by fn is rethrown here. Not reentrant: a
  // nested call from inside fn runs serially on the calling thread.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  struct Job;
  void worker_loop();
  static void run_chunks(Job& job);

  // A decode step calls parallel_for hundreds of times with a few microseconds between calls: a worker spins on
  // generation_ for a while after each job before it sleeps on wake_, and the caller spins on active_ before it
  // sleeps on done_ (thread_pool.cpp says why no wake-up is lost and which workers the caller waits for).
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<Job*> job_{nullptr};     // the job workers may join; null once its caller has done its chunks
  std::atomic<size_t> generation_{0};  // bumped per job and at stop
  std::atomic<size_t> active_{0};      // workers inside a job
  std::atomic<bool> stop_{false};
};

// The process-wide pool; its size is set once by set_default_threads (e.g. from --threads) before first use.
ThreadPool& default_pool();
void set_default_threads(size_t threads);

}  // namespace lowbit
