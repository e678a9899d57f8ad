// Qwen3-ASR's audio encoder as data: its layers are family.h layers (LayerNorm, bidirectional attention with
// biases and no RoPE, a plain GELU MLP), run by the CPU interpreter over one attention window at a time; the
// convolution front end and the projector around them are named here and computed in speech.cpp.
#pragma once

#include <string_view>

#include "lowbit/model/family.h"
#include "lowbit/model/speech.h"

namespace lowbit::model {

// The encoder's layers as a ModelConfig (dim d_model, heads = KV heads, hidden encoder_ffn_dim, room for one
// window) and their description.
ModelConfig audio_encoder_config(const AudioEncoderConfig& a);
ModelDesc describe_audio_encoder(const AudioEncoderConfig& a);

}  // namespace lowbit::model
