// lowbit export ART OUT --format audio8-v2: writes a verified lowbit artifact as an audio8 mixed bundle (seed 001)
// with codes and scales copied unchanged, so that bundles round-trip through `lowbit import`.
#include <fmt/format.h>

#include <string>

#include "command.h"
#include "lowbit/artifact/audio8_bundle.h"
#include "lowbit/artifact/reader.h"

namespace {

namespace audio8 = lowbit::artifact::audio8;

struct Options {
  std::string artifact, out, format = "audio8-v2";
  bool force = false;
  bool no_verify_hash = false;
};

void run(const Options& o) {
  lowbit::artifact::ReadOptions read;
  read.verify_hash = !o.no_verify_hash;
  const auto art = lowbit::artifact::Artifact::open(o.artifact, read);
  const std::string_view format = o.format == "audio8-v1" ? audio8::kFormatV1 : audio8::kFormatV2;
  audio8::export_bundle(art, o.out, {.format = format, .force = o.force});
  fmt::print("exported {} as {} into {}\n", o.artifact, format, o.out);
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("export", "Write an artifact as an audio8 mixed bundle (codes copied unchanged)");
  cmd->add_option("artifact", o.artifact, "Artifact directory")->required();
  cmd->add_option("out", o.out, "New bundle directory")->required();
  cmd->add_option("--format", o.format, "Bundle format")->check(CLI::IsMember({"audio8-v1", "audio8-v2"}));
  cmd->add_flag("--force", o.force, "Replace an existing directory at OUT");
  cmd->add_flag("--no-verify-hash", o.no_verify_hash, "Skip the artifact's SHA-256 checks (trusted local files only)");
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(export, setup);
