// A progress bar on stderr: done of total, rate, ETA and resident memory. Redraws in place on a terminal and
// prints a plain line every few seconds otherwise, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace lowbit {

class Progress {
 public:
  Progress(std::string label, uint64_t total, std::string unit = "it");
  ~Progress();  // finishes the line
  void advance(uint64_t n = 1);
  void set_note(std::string note);  // shown after the numbers, e.g. the tensor in flight
  void finish();

 private:
  void draw(bool final);
  std::string label_, unit_, note_;
  uint64_t total_, done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool tty_, finished_ = false, enabled_;
};

// Current and peak resident set size of this process, in bytes.
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();

std::string human_bytes(uint64_t bytes);

}  // namespace lowbit
