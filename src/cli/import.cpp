// lowbit import SRC OUT: an audio8 mixed bundle or a Phonon packed directory, verified by its own loader's rules,
// written as a lowbit artifact with the codes and scales copied unchanged (nothing is re-quantized).
#include <fmt/format.h>

#include <string>

#include "command.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/core/error.h"

namespace {

struct Options {
  std::string source, out;
  bool force = false;
  bool no_verify_hash = false;
};

void run(const Options& o) {
  using namespace lowbit::artifact;
  const ForeignFormat* format = find_foreign_format(o.source);
  if (!format)
    lowbit::fail(lowbit::Errc::format, "[import] {}: not an audio8 mixed bundle or a Phonon packed directory",
                 o.source);
  const ForeignModel model = format->open(o.source, {.verify_hash = !o.no_verify_hash});
  for (const std::string& part : model.unsupported)
    fmt::print(stderr, "[import] {}: '{}' is copied but not run by lowbit\n", o.source, part);
  ArtifactWriter writer(o.out, {.force = o.force});
  import_foreign(model, writer);
  const Manifest& m = writer.commit();
  fmt::print("imported {} ({}): {} tensors into {}\n", o.source, model.format, m.tensors.size(), o.out);
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("import", "Convert an audio8 bundle or a Phonon packed directory into a lowbit artifact, losslessly");
  cmd->add_option("src", o.source, "audio8 bundle or Phonon directory")->required();
  cmd->add_option("out", o.out, "New artifact directory")->required();
  cmd->add_flag("--force", o.force, "Replace an existing artifact at OUT (atomically)");
  cmd->add_flag("--no-verify-hash", o.no_verify_hash, "Skip the source's SHA-256 checks (trusted local files only)");
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(import, setup);
