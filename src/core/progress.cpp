#include "lowbit/core/progress.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace lowbit {

uint64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t peak_rss_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
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

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      start_(std::chrono::steady_clock::now()), last_draw_(start_),
      tty_(::isatty(STDERR_FILENO) != 0), enabled_(std::getenv("LOWBIT_NO_PROGRESS") == nullptr) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t n) {
  done_ += n;
  const auto now = std::chrono::steady_clock::now();
  const auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (now - last_draw_ >= interval) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::set_note(std::string note) { note_ = std::move(note); }

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final) {
  if (!enabled_) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
  std::string line = fmt::format("{}: {}/{} {}", label_, done_, total_, unit_);
  if (total_ > 0) {
    const double frac = static_cast<double>(done_) / static_cast<double>(total_);
    const int width = 24;
    const int filled = static_cast<int>(frac * width);
    line = fmt::format("{} [{}{}] {:3.0f}%", line, std::string(filled, '#'), std::string(width - filled, '.'),
                       100.0 * frac);
  }
  line += fmt::format(" {:.1f} {}/s", rate, unit_);
  if (!final && rate > 0 && total_ > done_) line += fmt::format(" ETA {:.0f}s", (total_ - done_) / rate);
  if (final) line += fmt::format(" in {:.1f}s", secs);
  line += fmt::format(" RSS {}", human_bytes(current_rss_bytes()));
  if (!note_.empty() && !final) line += " " + note_;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace lowbit
