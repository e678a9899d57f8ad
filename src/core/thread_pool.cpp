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
  stop_.store(true);
  {
    std::lock_guard lock(mutex_);
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

// A worker joins the job it finds published in job_, counted in active_; the caller unpublishes the job when its
// chunks are done and waits only for the workers that joined it. The caller's store of null before its load of
// active_, and a worker's increment of active_ before its load of job_ (all sequentially consistent), mean that a
// worker that finds the job is one the caller waits for. A worker that is not running (a loaded machine) is not
// waited for: the caller and the running workers take its chunks.
void ThreadPool::worker_loop() {
  t_inside_pool = true;
  size_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load() != seen; })) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load();
    if (stop_.load()) return;
    active_.fetch_add(1);
    if (Job* job = job_.load()) run_chunks(*job);
    if (active_.fetch_sub(1) == 1) {
      // Taking mutex_ orders this after a caller's check of active_ under it, before it waits.
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
  job_.store(&job);
  {
    // Bumped under mutex_ so that a worker about to sleep either sees it or is woken.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  t_inside_pool = true;
  run_chunks(job);
  t_inside_pool = false;
  job_.store(nullptr);
  const auto none_active = [&] { return active_.load() == 0; };
  if (!spin_until(none_active)) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, none_active);
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
