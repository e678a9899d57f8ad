// Tables of ggml's IQ ("importance") quantization types: data of the format's specification, not code. Copied
// from ggml/src/ggml-common.h of the llama.cpp vendored in llama-cpp-python 0.3.36 (MIT licence, (c) the ggml
// authors), where each is named as here.
#pragma once

#include <cstdint>

namespace lowbit::io {

// IQ4_NL and IQ4_XS: the 16 non-uniform levels a 4-bit code selects (kvalues_iq4nl).
inline constexpr int8_t kValuesIq4Nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace lowbit::io
