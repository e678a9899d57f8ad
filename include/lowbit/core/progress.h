// A progress bar on stderr: done of total, rate, ETA and resident memory. A ticker thread redraws it in place on a
// terminal every second even while no unit finishes (a 12288-column Cholesky takes minutes), and prints a plain
// line every few seconds otherwise, so logs stay readable. Work is counted in the unit that predicts time (weights,
// bytes), not in items, so the ETA holds when items differ in size.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace lowbit {

// What one line of a progress bar shows.
struct ProgressLine {
  std::string label;
  std::string unit;  // "B" prints sizes (KiB, MiB, ...); any other unit prints counts (k, M, G)
  uint64_t done = 0, total = 0;
  double seconds = 0;
  uint64_t rss_bytes = 0;
  std::string note;
  bool final = false;
};

// "quantize: 1.2G/8.2G weights [###.....]  15% 40.1M weights/s ETA 175s RSS 2.1 GiB note".
std::string format_progress(const ProgressLine& line);

class Progress {
 public:
  Progress(std::string label, uint64_t total, std::string unit = "it");
  ~Progress();  // finishes the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void advance(uint64_t n = 1);
  void set_note(std::string note);  // shown after the numbers, e.g. the tensor in flight
  void finish();

 private:
  void draw(bool final);
  void tick();
  std::string label_, unit_, note_;
  uint64_t total_;
  std::atomic<uint64_t> done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool tty_, finished_ = false, enabled_;
  std::mutex mutex_;  // guards note_, last_draw_, finished_ and the drawing
  std::condition_variable wake_;
  std::thread ticker_;
};

// Current and peak resident set size of this process, in bytes (the peak from getrusage: anonymous and file-backed
// together).
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();

// Resident memory split as /proc/self/status reports it: anonymous (heap, buffers) and file-backed (mapped files'
// pages). The peaks are the largest values sampled since start_rss_sampling() (every 50 ms by a background thread)
// or since the process began reading them; `total` is the largest sum sampled, not the sum of the two peaks.
struct ResidentMemory {
  uint64_t anon = 0, file = 0, total = 0;
};
ResidentMemory current_resident();
void start_rss_sampling();  // idempotent
ResidentMemory peak_resident();

std::string human_bytes(uint64_t bytes);
std::string human_count(double n);  // 950, 1.2k, 3.4M, 5.6G

}  // namespace lowbit
