// libFuzzer target: the config.json of an MLX checkpoint (its "quantization" section included), loaded by
// load_mlx beside a fixed safetensors file with one quantized module.
#include "fuzz/fuzz_input.h"
#include "lowbit/model/mlx.h"

namespace {

// model.layers.0.mlp.up_proj as MLX stores it at 4 bits, group 64: U32 codes [2, 8], F16 scales and biases [2, 1].
std::string fixed_checkpoint() {
  const std::string header =
      R"({"model.layers.0.mlp.up_proj.weight":{"dtype":"U32","shape":[2,8],"data_offsets":[0,64]},)"
      R"("model.layers.0.mlp.up_proj.scales":{"dtype":"F16","shape":[2,1],"data_offsets":[64,68]},)"
      R"("model.layers.0.mlp.up_proj.biases":{"dtype":"F16","shape":[2,1],"data_offsets":[68,72]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(n >> (8 * i));
  return file + header + std::string(72, '\x11');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  static const auto dir = [] {
    fuzz::write_file("mlx/model.safetensors", fixed_checkpoint());
    return fuzz::work_dir() / "mlx";
  }();
  fuzz::write_file("mlx/config.json", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { model::load_mlx(dir); });
}
