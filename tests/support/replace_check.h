// Crash-consistency helpers for writers run as the lowbit binary (LOWBIT_CLI): directory snapshots, and a loop
// that SIGKILLs a writer at random points and checks the destination after every kill.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lowbit::testing {

// Every file under `dir` (relative path -> contents); empty when `dir` is absent.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[std::filesystem::relative(e.path(), dir).string()] = {std::istreambuf_iterator<char>(in), {}};
  }
  return files;
}

// Starts `lowbit args...` with output discarded; returns its pid.
inline pid_t spawn_cli(const std::vector<std::string>& args) {
  std::vector<char*> argv{const_cast<char*>(LOWBIT_CLI)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(LOWBIT_CLI, argv.data());
    ::_exit(127);
  }
  return pid;
}

// Runs `args_for(run)` for runs 1..runs, each SIGKILLed after a random delay of up to 1.3 times `full` (so some
// runs finish), then calls `check(run)`. Returns how many runs exited on their own.
inline int kill_at_random_points(int runs, uint64_t seed, std::chrono::microseconds full,
                                 const std::function<std::vector<std::string>(int)>& args_for,
                                 const std::function<void(int)>& check) {
  std::mt19937_64 rng(seed);
  int finished = 0;
  for (int run = 1; run <= runs; ++run) {
    const pid_t pid = spawn_cli(args_for(run));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<uint64_t>(full.count() * 13 / 10 + 1)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFEXITED(status)) ++finished;
    check(run);
  }
  return finished;
}

// Wall time of one uninterrupted `lowbit args...`, which must succeed.
inline std::chrono::microseconds time_cli(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = spawn_cli(args);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << args.front() << " failed";
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
}

}  // namespace lowbit::testing
