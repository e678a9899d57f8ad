// Random stored arrays for a codec, without running its encoder: uniformly random code words (every bit
// stream is a valid trellis or affine code) and N(0, sigma) floats in each float array's dtype. Shared by the
// GPU tests and bench_cuda; large shapes take seconds instead of the encoder's minutes.
#pragma once

#include <random>
#include <string>

#include "lowbit/codec/codec.h"
#include "lowbit/core/dtype.h"

namespace lowbit::testing {

struct RandomTensor {
  codec::EncodedTensor encoded;
  codec::TensorRef ref;
};

// params must be complete (padded sizes included where the codec requires them to be derivable).
inline RandomTensor random_tensor(const std::string& id, const codec::Params& params, int64_t rows, int64_t cols,
                                  std::mt19937_64& rng, float sigma = 0.02f) {
  const codec::Codec& c = codec::codec_or_throw(id, "random_tensor");
  RandomTensor t;
  t.encoded.params = params;
  std::normal_distribution<float> nd(0.0f, sigma);
  for (const auto& spec : c.arrays(params, {rows, cols})) {
    TensorBuffer b = make_buffer(spec.dtype, spec.shape);
    const size_t size = dtype_size(spec.dtype), n = b.bytes.size() / size;
    if (spec.dtype == DType::F32 || spec.dtype == DType::F16 || spec.dtype == DType::BF16) {
      for (size_t i = 0; i < n; ++i) store_float(spec.dtype, b.bytes.data(), i, nd(rng));
    } else {
      for (auto& byte : b.bytes) byte = static_cast<std::byte>(rng());
    }
    t.encoded.arrays.emplace_back(spec.role, std::move(b));
  }
  t.ref = {&c, t.encoded.params, {rows, cols}, t.encoded.views()};
  return t;
}

}  // namespace lowbit::testing
