// llama2.c formats (github.com/karpathy/llama2.c).
//
// Checkpoint, "version 0": a header of 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len; a negative vocab_size means an unshared classifier follows), then f32 tensors in run.c's order:
// embedding, attention norms, wq, wk, wv, wo, ffn norms, w1, w2, w3, final norm, the RoPE tables
// freq_cis_real/imag (seq_len * head_size / 2 each, skipped), then the classifier when unshared.
// The q/k rows stay in llama2.c's interleaved-pair RoPE order (config.rope_style = interleaved); the forward
// pass rotates pairs, exactly as run.c does, and `lowbit convert` permutes them to HF's half layout.
//
// Tokenizer (tok512.bin, tokenizer.bin): int32 max_token_length, then per token: f32 score, int32 length,
// that many bytes. Token 0 is <unk>, 1 BOS, 2 EOS; <0xXX> tokens are raw bytes.
#pragma once

#include <filesystem>
#include <memory>

#include "lowbit/model/model.h"
#include "lowbit/model/tokenizer.h"

namespace lowbit::model {

std::unique_ptr<Model> load_llama2c(const std::filesystem::path& path, const LoadOptions& options = {});

// Reads every token up to the end of the file. encode() is run.c's: a dummy " " token before non-empty text,
// code points looked up whole or as <0xXX> byte tokens, then greedy merges of the best-scoring adjacent pair.
// BOS also ends a sequence (run.c stops there), so eos_ids() is {EOS, BOS}.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path);

}  // namespace lowbit::model
