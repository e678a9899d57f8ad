#include "lowbit/core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

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

// How long a thread spins on a counter before it sleeps: longer than the gap between a decode step's kernels,
// short enough that an idle pool stops using the cores at once.
constexpr auto kSpin = std::chrono::microseconds(200);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool spin_until(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
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

// Every worker takes part in every job (finding no chunk left is taking part) and counts itself done, so the
// caller knows when no worker can still touch the job it owns.
void ThreadPool::worker_loop() {
  t_inside_pool = true;
  size_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
    }
    // job_ and stop_ were written before the bump of generation_ that this thread has seen (an acquire load, or
    // one under mutex_), and the caller writes job_ again only after this worker counts itself done.
    if (stop_) return;
    seen = generation_.load(std::memory_order_relaxed);
    run_chunks(*job_);
    if (done_count_.fetch_add(1, std::memory_order_acq_rel) + 1 == workers_.size()) {
      // Taking mutex_ orders this after a caller's check of done_count_ under it, before it waits.
      { std::lock_guard lock(mutex_); }
      done_.notify_one();
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
    done_count_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  t_inside_pool = true;
  run_chunks(job);
  t_inside_pool = false;
  const auto all_done = [&] { return done_count_.load(std::memory_order_acquire) == workers_.size(); };
  if (!spin_until(all_done)) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, all_done);
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
