// The lowbit binary over artifacts: exit codes and output of verify / inspect / demo-artifact, and crash
// consistency: writers SIGKILLed at random points never leave a destination that is present but not a complete,
// verifying artifact, and never lose the artifact a --force replacement was replacing.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "artifact/artifact_fixture.h"

namespace lowbit::artifact::testing {
namespace {

// Starts `lowbit args...` with output discarded; returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args) {
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

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, VerifyAcceptsWhatDemoArtifactWrites) {
  TempDir tmp;
  const std::string dir = (tmp / "demo").string();
  const CliResult w = run_cli({"demo-artifact", dir, "--tensors", "5", "--seed", "9", "--shard-bytes", "20000"});
  ASSERT_EQ(w.status, 0) << w.err;
  const CliResult v = run_cli({"verify", dir});
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_EQ(v.out.rfind("OK: 5 tensors, ", 0), 0u) << v.out;
  EXPECT_EQ(run_cli({"verify", dir, "--paranoid"}).status, 0);
  EXPECT_EQ(run_cli({"verify", dir, "--no-verify-hash"}).status, 0);
}

TEST(Cli, InspectPrintsATableOrOneJsonObject) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 21);
  const CliResult table = run_cli({"inspect", (tmp / "a").string()});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("layers.2.weight"), std::string::npos);
  EXPECT_NE(table.out.find("offset_scale"), std::string::npos);
  const CliResult j = run_cli({"inspect", (tmp / "a").string(), "--json"});
  ASSERT_EQ(j.status, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["tensors"].size(), 6u);
  EXPECT_EQ(doc["totals"]["tensors"], 6);
  EXPECT_GT(doc["tensors"][3]["bits_per_weight"].get<double>(), 4.0);
  EXPECT_EQ(doc["config"]["model_type"], "test");
}

TEST(Cli, ExitCodesSayWhatWentWrong) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 22);
  std::ofstream(tmp / "a" / "config.json", std::ios::app) << ' ';
  const CliResult bad = run_cli({"verify", (tmp / "a").string()});
  EXPECT_EQ(bad.status, 3);
  EXPECT_EQ(count_lines(bad.err), 1u) << bad.err;
  EXPECT_NE(bad.err.find("config.json"), std::string::npos) << bad.err;
  EXPECT_TRUE(bad.out.empty());
  EXPECT_EQ(run_cli({"verify", (tmp / "absent").string()}).status, 3);
  EXPECT_EQ(run_cli({"verify"}).status, 2);
  EXPECT_EQ(run_cli({"verify", (tmp / "a").string(), "--no-such-flag"}).status, 2);
  EXPECT_EQ(run_cli({"inspect"}).status, 2);
  const CliResult exists = run_cli({"demo-artifact", (tmp / "a").string()});
  EXPECT_EQ(exists.status, 1);
  EXPECT_NE(exists.err.find("--force"), std::string::npos) << exists.err;
}

// Writes with many one-tensor shards (one fsync each) so that kills land in every phase of the write.
std::vector<std::string> demo_args(const fs::path& dest, uint64_t seed, bool force) {
  std::vector<std::string> args{"demo-artifact", dest.string(), "--tensors", "16", "--shard-bytes", "1",
                                "--seed", std::to_string(seed)};
  if (force) args.push_back("--force");
  return args;
}

TEST(CrashConsistency, KilledWritersLeaveNothingOrACompleteArtifact) {
  TempDir tmp;
  const fs::path dest = tmp / "art";
  std::mt19937_64 rng(20261202);

  // One uninterrupted run times the write.
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(run_cli(demo_args(dest, 0, false)).status, 0);
  const auto full = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  fs::remove_all(dest);

  constexpr int kRuns = 24;
  int absent = 0, complete = 0, replaced = 0, kept = 0;
  for (int run = 1; run <= kRuns; ++run) {
    const bool replace = run % 2 == 0;  // even runs replace an existing artifact with --force
    uint64_t before = 0;
    if (replace) {
      if (!fs::exists(dest)) {
        ASSERT_EQ(run_cli(demo_args(dest, 1000 + run, false)).status, 0);
      }
      before = Artifact::open(dest).provenance().seeds.at("demo");
    } else {
      fs::remove_all(dest);
    }
    const pid_t pid = spawn_cli(demo_args(dest, static_cast<uint64_t>(run), replace));
    // Up to 1.3 times the uninterrupted write, so some runs finish before the kill.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<uint64_t>(full.count() * 13 / 10 + 1)));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);

    if (!fs::exists(dest)) {
      EXPECT_FALSE(replace) << "run " << run << ": a --force replacement lost the old artifact";
      ++absent;
      continue;
    }
    uint64_t seed = 0;
    ASSERT_NO_THROW(seed = Artifact::open(dest).provenance().seeds.at("demo")) << "run " << run;
    if (seed == static_cast<uint64_t>(run)) {
      (replace ? replaced : complete)++;
    } else {
      EXPECT_TRUE(replace && seed == before) << "run " << run << " found seed " << seed;
      ++kept;
    }
  }
  // The next writer into the directory removes what the killed ones left behind.
  ASSERT_EQ(run_cli(demo_args(dest, 99, true)).status, 0);
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename(), "art") << "left behind: " << e.path();
  std::cerr << "[crash] " << kRuns << " kills: " << absent << " absent, " << complete << " complete, " << replaced
            << " replaced, " << kept << " kept the old artifact\n";
}

}  // namespace
}  // namespace lowbit::artifact::testing
