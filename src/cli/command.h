// Subcommand registration: each file in src/cli/ adds one `lowbit <command>` with LOWBIT_COMMAND, so adding a
// command never means editing main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "lowbit/model/cuda_model.h"

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

// --devices on the commands that run a model (generate, chat, eval, bench, serve): the GPUs of tensor parallelism
// (cuda_model.h's tensor_parallel), with --device cuda.
inline void add_devices_option(CLI::App* cmd, std::string& devices) {
  cmd->add_option("--devices", devices, "GPU ids for tensor parallelism over NCCL, e.g. 0,1 (with --device cuda)");
}
// The parsed list (Errc::usage for a malformed one); empty when the flag was not given.
inline std::vector<int> devices_of(const std::string& flag) {
  return flag.empty() ? std::vector<int>{} : model::parse_devices(flag);
}

}  // namespace lowbit::cli

#define LOWBIT_COMMAND(name, setup) \
  static const ::lowbit::cli::CommandRegistrar lowbit_command_registrar_##name(#name, setup)
