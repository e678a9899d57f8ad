// lowbit verify ART: every check of docs/FORMAT.md ("What a reader checks"), or of a foreign format's own loader
// (audio8 bundles, Phonon packed directories); one line on stdout when it passes.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "command.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/reader.h"

namespace {

struct Options {
  std::string artifact;
  bool no_verify_hash = false;
  bool paranoid = false;
};

void verify_foreign(const lowbit::artifact::ForeignFormat& format, const Options& o) {
  const auto model = format.open(o.artifact, {.verify_hash = !o.no_verify_hash});
  fmt::print("OK: {}, {} tensors, {} aliases", model.format, model.tensors.size(), model.aliases.size());
  if (!model.unsupported.empty()) fmt::print("; not run by lowbit: {}", fmt::join(model.unsupported, ", "));
  fmt::print("\n");
}

void run(const Options& o) {
  using namespace lowbit::artifact;
  if (const auto* foreign = find_foreign_format(o.artifact)) return verify_foreign(*foreign, o);
  ReadOptions options;
  options.verify_hash = !o.no_verify_hash;
  options.paranoid = o.paranoid;
  const Artifact a = Artifact::open(o.artifact, options);
  std::printf("OK: %zu tensors, %zu files, %llu bytes\n", a.manifest().tensors.size(),
              a.manifest().files.size() + 1, static_cast<unsigned long long>(a.total_bytes()));
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("verify", "Check an artifact completely: manifest, files, hashes, payloads, codecs (also audio8 bundles and Phonon directories)");
  cmd->add_option("artifact", o.artifact, "Artifact directory")->required();
  cmd->add_flag("--no-verify-hash", o.no_verify_hash, "Skip the SHA-256 checks (trusted local files only)");
  cmd->add_flag("--paranoid", o.paranoid, "Hash every file again after loading");
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(verify, setup);
