// Phonon packed-decoder directories (seed 000; docs/FORMAT.md, "Foreign formats"): a Qwen3-ASR model as
// mlx_audio lays it out (config.json, MLX-layout safetensors weights) whose linears named in packed_manifest.json
// are two-plane five-state linears (planes, quint5 or trit3 codes; full or slim metadata), optionally with the
// embedding and selected linears in MLX's native affine format ("hybrid"). Opened with every check of the seed's
// loader and loaded strictly: every array the model expects is present with its dtype and shape, nothing is left
// over. Codes and metadata are exposed zero-copy through the two_plane and affine codecs; the text decoder under
// the Hugging Face Qwen3 names the runtime uses, the audio tower under its own names, reported as not run.
#pragma once

#include <filesystem>
#include <string_view>

#include "lowbit/artifact/foreign.h"

namespace lowbit::artifact::phonon {

inline constexpr std::string_view kFormatName = "phonon-packed-decoder";
inline constexpr std::string_view kManifestFile = "packed_manifest.json";

// A directory holding config.json and packed_manifest.json but no manifest.json (nothing is parsed).
bool recognizes(const std::filesystem::path& dir);

// Throws lowbit::Error (one line naming the file and the field or tensor) for any rule the format breaks.
ForeignModel open(const std::filesystem::path& dir, const ForeignOpenOptions& options);

}  // namespace lowbit::artifact::phonon
