// lowbit version: the tool version and the codecs it knows.
#include <cstdio>

#include "command.h"
#include "lowbit/codec/codec.h"

namespace {

void setup(CLI::App& root) {
  auto* cmd = root.add_subcommand("version", "Print the version and the supported codecs");
  cmd->callback([] {
    std::printf("lowbit %s\ncodecs:", LOWBIT_VERSION);
    for (const auto& c : lowbit::codec::all_codecs()) std::printf(" %.*s", static_cast<int>(c.id.size()), c.id.data());
    std::printf("\n");
  });
}

}  // namespace

LOWBIT_COMMAND(version, setup);
