// Subcommand registration: each file in src/cli/ adds one `lowbit <command>` with LOWBIT_COMMAND, so adding a
// command never means editing main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <string_view>
#include <vector>

namespace lowbit::cli {

using CommandSetup = void (*)(CLI::App& root);

struct CommandEntry {
  std::string_view name;
  CommandSetup setup;
};

std::vector<CommandEntry>& command_table();

struct CommandRegistrar {
  CommandRegistrar(std::string_view name, CommandSetup setup) { command_table().push_back({name, setup}); }
};

}  // namespace lowbit::cli

#define LOWBIT_COMMAND(name, setup) \
  static const ::lowbit::cli::CommandRegistrar lowbit_command_registrar_##name(#name, setup)
