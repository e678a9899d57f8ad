#include "lowbit/core/progress.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace lowbit {

namespace {

// The process-wide sampler's peaks, updated by every sample.
std::atomic<uint64_t> g_peak_anon = 0, g_peak_file = 0, g_peak_total = 0;

void raise_to(std::atomic<uint64_t>& peak, uint64_t v) {
  for (uint64_t seen = peak.load(); v > seen && !peak.compare_exchange_weak(seen, v);) {
  }
}

ResidentMemory sample() {
  const ResidentMemory r = current_resident();
  raise_to(g_peak_anon, r.anon);
  raise_to(g_peak_file, r.file);
  raise_to(g_peak_total, r.total);
  return r;
}

std::string amount(double v, bool bytes) { return bytes ? human_bytes(static_cast<uint64_t>(v)) : human_count(v); }

}  // namespace

uint64_t current_rss_bytes() { return current_resident().total; }

uint64_t peak_rss_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

ResidentMemory current_resident() {
  std::ifstream status("/proc/self/status");
  ResidentMemory r;
  std::string key;
  uint64_t kib = 0;
  uint64_t shmem = 0;
  while (status >> key) {
    if (key == "RssAnon:" && status >> kib)
      r.anon = kib * 1024;
    else if (key == "RssFile:" && status >> kib)
      r.file = kib * 1024;
    else if (key == "RssShmem:" && status >> kib)
      shmem = kib * 1024;
    status.ignore(1 << 10, '\n');
  }
  r.total = r.anon + r.file + shmem;
  return r;
}

void start_rss_sampling() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::thread([] {
      for (;;) {
        sample();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }).detach();
  });
}

ResidentMemory peak_resident() {
  sample();
  return {g_peak_anon.load(), g_peak_file.load(), g_peak_total.load()};
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string human_count(double n) {
  const char* units[] = {"", "k", "M", "G", "T"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f}", n) : fmt::format("{:.1f}{}", n, units[u]);
}

std::string format_progress(const ProgressLine& p) {
  const bool bytes = p.unit == "B";
  const auto done = static_cast<double>(p.done), total = static_cast<double>(p.total);
  const std::string unit = bytes ? "" : " " + p.unit;
  std::string line = fmt::format("{}: {}/{}{}", p.label, amount(done, bytes), amount(total, bytes), unit);
  if (p.total > 0) {
    const double frac = std::min(1.0, done / total);
    const int width = 24;
    const int filled = static_cast<int>(frac * width);
    line += fmt::format(" [{}{}] {:3.0f}%", std::string(filled, '#'), std::string(width - filled, '.'), 100.0 * frac);
  }
  const double rate = p.seconds > 0 ? done / p.seconds : 0.0;
  line += fmt::format(" {}{}/s", amount(rate, bytes), bytes ? "" : unit);
  if (!p.final && rate > 0 && p.total > p.done) line += fmt::format(" ETA {:.0f}s", (total - done) / rate);
  if (p.final) line += fmt::format(" in {:.1f}s", p.seconds);
  line += " RSS " + human_bytes(p.rss_bytes);
  if (!p.note.empty() && !p.final) line += " " + p.note;
  return line;
}

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      tty_(::isatty(STDERR_FILENO) != 0),
      enabled_(std::getenv("LOWBIT_NO_PROGRESS") == nullptr) {
  if (enabled_) ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() { finish(); }

// Redraws every second on a terminal (every five in a log) whether or not advance() was called.
void Progress::tick() {
  const auto interval = tty_ ? std::chrono::seconds(1) : std::chrono::seconds(5);
  std::unique_lock lock(mutex_);
  while (!finished_) {
    wake_.wait_for(lock, interval);
    if (finished_) break;
    if (std::chrono::steady_clock::now() - last_draw_ >= interval) draw(false);
  }
}

void Progress::advance(uint64_t n) {
  done_ += n;
  if (!tty_) return;  // logs get the ticker's lines only
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (lock && !finished_ && std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100))
    draw(false);
}

void Progress::set_note(std::string note) {
  std::lock_guard lock(mutex_);
  note_ = std::move(note);
}

void Progress::finish() {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finished_ = true;
    draw(true);
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void Progress::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  if (!enabled_) return;
  const ResidentMemory rss = sample();
  const std::string line =
      format_progress({label_, unit_, done_.load(), total_, std::chrono::duration<double>(last_draw_ - start_).count(),
                       rss.total, note_, final});
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace lowbit
