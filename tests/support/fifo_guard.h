// Hostile-input helper: a FIFO where a regular file is expected. A reader that opens it without checking its type
// waits for a writer forever; here a writer comes after a few seconds, so such a regression fails the test
// (released == true) instead of hanging the suite.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "lowbit/core/error.h"

namespace lowbit::testing {

// Makes a FIFO at `path`, runs `read`, and returns the Error it threw; fails the test if `read` opened the FIFO
// (the writer had to release it) or did not throw a lowbit::Error.
template <class Read>
Errc read_fifo(const std::filesystem::path& path, Read&& read) {
  std::filesystem::remove(path);
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  std::atomic<bool> done{false}, released{false};
  std::thread writer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!done && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    while (!done) {
      // Succeeds only while a reader has the FIFO open: that reader is blocked, or about to read its EOF.
      const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) {
        released = true;
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Errc code = Errc::internal;
  bool threw = false;
  try {
    read();
  } catch (const Error& e) {
    code = e.code();
    threw = true;
  }
  done = true;
  writer.join();
  EXPECT_FALSE(released) << path << ": the reader opened the FIFO and waited for a writer";
  EXPECT_TRUE(threw) << path << ": a FIFO was accepted";
  std::filesystem::remove(path);
  return code;
}

}  // namespace lowbit::testing
