// libFuzzer target: the artifact reader, Artifact::open on a directory whose manifest.json is the input, beside the
// payload and config.json of a fixed two-tensor artifact (written once at start; the seed corpus holds its
// manifest, which the target leaves in /tmp/lowbit-fuzz-<pid>/artifact.seed.json). Hashes are not checked, so that
// mutations of everything else reach the payload and codec checks.
#include "fuzz/fuzz_input.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/codec/codec.h"

namespace {

std::filesystem::path fixture() {
  using namespace lowbit;
  const auto dir = fuzz::work_dir() / "artifact";
  std::filesystem::remove_all(dir);
  artifact::ArtifactWriter w(dir);
  const std::vector<float> values = {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, -1.0f, 0.0f, 2.0f};
  w.add_dense("a.weight", TensorView{DType::F32, {2, 4}, std::as_bytes(std::span(values))});
  w.add_dense("b.bias", TensorView{DType::F32, {8}, std::as_bytes(std::span(values))});
  w.add_file_contents("config.json", artifact::FileRole::config, R"({"model_type": "fuzz"})");
  w.set_config({{"model_type", "fuzz"}});
  w.commit();
  // Kept for fuzz/corpus/fuzz_artifact_reader/ (the inputs overwrite the fixture's own manifest).
  std::filesystem::copy_file(dir / "manifest.json", fuzz::work_dir() / "artifact.seed.json",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  static const auto dir = fixture();
  fuzz::write_file("artifact/manifest.json", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { artifact::Artifact::open(dir, {.verify_hash = false}); });
}
