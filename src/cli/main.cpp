// lowbit: one binary, one subcommand per file. Results go to stdout, diagnostics to stderr; exit status 0 on
// success, 2 for usage errors, 3 for invalid input or artifacts, 1 for anything else.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "command.h"
#include "lowbit/core/error.h"

namespace lowbit::cli {

std::vector<CommandEntry>& command_table() {
  static std::vector<CommandEntry> table;
  return table;
}

}  // namespace lowbit::cli

int main(int argc, char** argv) {
  CLI::App app{"lowbit: low-bit quantization toolkit and runtime for transformer checkpoints", "lowbit"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lowbit " LOWBIT_VERSION);
  auto& table = lowbit::cli::command_table();
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& entry : table) entry.setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const lowbit::Error& e) {
    std::fprintf(stderr, "lowbit: error: %s\n", e.what());
    return lowbit::exit_code(e.code());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "lowbit: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lowbit: error: %s\n", lowbit::printable(e.what(), lowbit::Error::kMaxMessageBytes).c_str());
    return 1;
  }
  return 0;
}
