// Example parameters per codec id and the widths each must handle, shared by the CPU kernel harness
// (tests/kernels) and the CUDA kernel tests (tests/cuda), which both iterate codec::all_codecs() over it. A codec
// added to the registry without an entry here fails KernelRegistry.CodecsHaveExamples and the CUDA sweep: add its
// params (every bit width / variant worth running).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::testing {

struct CodecExample {
  std::vector<codec::Params> params;
  std::vector<int64_t> widths;  // smallest legal widths first, then odd and multi-group ones
};

inline const std::map<std::string, CodecExample>& codec_examples() {
  static const std::map<std::string, CodecExample> table = [] {
    std::map<std::string, CodecExample> t;
    t["dense"] = {{{{"dtype", "bf16"}}, {{"dtype", "f16"}}, {{"dtype", "f32"}}}, {1, 7, 64, 301}};
    CodecExample affine;
    for (int bits : {2, 3, 4, 5, 6, 8})
      affine.params.push_back({{"bits", bits}, {"group_size", 32}, {"scale_dtype", "f16"}});
    affine.params.push_back({{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}});
    affine.params.push_back({{"bits", 3}, {"group_size", 128}, {"scale_dtype", "f32"}});
    affine.params.push_back({{"bits", 2}, {"group_size", 128}, {"scale_dtype", "bf16"}});
    // GGUF Q2_K, Q3_K and Q6_K as they load (3 bits in groups of 16 pad to pairs of groups)
    for (int bits : {2, 3, 6}) affine.params.push_back({{"bits", bits}, {"group_size", 16}, {"scale_dtype", "f32"}});
    affine.widths = {1, 31, 32, 33, 200, 544};
    t["affine"] = affine;
    t["offset_scale"] = {{{{"precision", "q3"}}, {{"precision", "q3_full8"}}, {{"precision", "q4"}}},
                         {1, 63, 64, 65, 200, 544}};
    CodecExample two_plane;
    for (const char* storage : {"planes", "quint5", "trit3"})
      two_plane.params.push_back({{"storage", storage}, {"metadata", "full"}, {"scale_dtype", "bf16"}});
    two_plane.params.push_back({{"storage", "planes"}, {"metadata", "slim"}, {"scale_dtype", "f16"}});
    two_plane.params.push_back({{"storage", "quint5"}, {"metadata", "slim"}, {"scale_dtype", "f32"}});
    two_plane.widths = {1, 127, 128, 129, 300};
    t["two_plane"] = two_plane;
    CodecExample trellis;  // small L keeps the Viterbi encodes cheap; every rotation and scale layout
    trellis.params.push_back({{"L", 8}, {"k", 2}, {"code", "1mad"}});
    trellis.params.push_back({{"L", 10}, {"k", 3}, {"code", "3inst"}, {"rotate", "both"}, {"scale", "tensor"}});
    trellis.params.push_back({{"L", 8}, {"k", 4}, {"code", "1mad"}, {"rotate", "none"}});
    trellis.params.push_back({{"L", 9}, {"k", 1}, {"code", "3inst"}, {"rotate", "none"}, {"scale", "tensor"}});
    trellis.widths = {1, 16, 17, 100};
    t["trellis"] = trellis;
    return t;
  }();
  return table;
}

}  // namespace lowbit::testing
