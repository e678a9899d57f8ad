// lowbit convert SRC OUT: any model lowbit loads, written as a dense HF-layout safetensors directory.
#include <cstdio>
#include <set>
#include <string>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/staged_dir.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/hf.h"

namespace {

namespace fs = std::filesystem;

// What convert --force may replace: a directory as convert writes it, config.json (a JSON object) and
// model.safetensors (a valid file) plus the tokenizer files it carries, and nothing else.
bool is_converted_directory(const fs::path& dir) {
  try {
    std::set<std::string> tokenizer_files;
    for (const fs::path& f : lowbit::model::tokenizer_files_beside(dir)) tokenizer_files.insert(f.filename().string());
    bool config = false, weights = false;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (e.is_symlink() || !e.is_regular_file()) return false;
      if (name == "config.json") {
        config = lowbit::io::read_json_file(e.path(), "convert", 16 << 20).is_object();
      } else if (name == "model.safetensors") {
        lowbit::io::SafetensorsFile::open(e.path());
        weights = true;
      } else if (!tokenizer_files.contains(name)) {
        return false;
      }
    }
    return config && weights;
  } catch (const lowbit::Error&) {
    return false;
  }
}

struct Options {
  std::string src, out;
  bool force = false;
};

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("convert", "Write a model as a dense HF-layout directory (config.json + model.safetensors)");
  cmd->add_option("src", o.src, "Model: llama2.c .bin, HF directory, lowbit artifact")->required();
  cmd->add_option("out", o.out, "New output directory")->required();
  cmd->add_flag("--force", o.force, "Replace a directory an earlier convert wrote at OUT (atomically)");
  cmd->callback([] {
    lowbit::StagedDirectory staging(o.out, "convert", o.force,
                                    {"a directory written by lowbit convert", is_converted_directory});
    const auto model = lowbit::model::load_model(o.src);
    lowbit::model::write_hf(*model, staging.path(), lowbit::model::tokenizer_files_beside(o.src));
    staging.publish();
    std::fprintf(stderr, "wrote %s (%zu tensors)\n", o.out.c_str(), model->tensors.size());
  });
}

}  // namespace

LOWBIT_COMMAND(convert, setup);
