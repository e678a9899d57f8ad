// lowbit convert SRC OUT: any model lowbit loads, written as a dense HF-layout safetensors directory.
#include <cstdio>
#include <string>

#include "command.h"
#include "lowbit/model/hf.h"

namespace {

void setup(CLI::App& root) {
  auto args = std::make_shared<std::pair<std::string, std::string>>();
  auto* cmd = root.add_subcommand("convert", "Write a model as a dense HF-layout directory (config.json + model.safetensors)");
  cmd->add_option("src", args->first, "Model: llama2.c .bin, HF directory, lowbit artifact")->required();
  cmd->add_option("out", args->second, "New output directory")->required();
  cmd->callback([args] {
    const auto model = lowbit::model::load_model(args->first);
    lowbit::model::write_hf(*model, args->second, lowbit::model::tokenizer_files_beside(args->first));
    std::fprintf(stderr, "wrote %s (%zu tensors)\n", args->second.c_str(), model->tensors.size());
  });
}

}  // namespace

LOWBIT_COMMAND(convert, setup);
