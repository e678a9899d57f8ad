// The CPU attention of one query head over a run of cached positions (the decode and prefill steps' attention),
// vectorized over the head dimension.
#pragma once

#include <cstddef>

namespace lowbit::kernels {

// out [hd] = sum_t p_t v_t for t < n, with p = softmax over t of s_t = scale * (q . k_t) (soft-capped as
// softcap * tanh(s_t / softcap) when softcap > 0); q [hd], k_t = keys + t * stride, v_t = values + t * stride,
// scores [n] is scratch.
void attend_head(const float* q, const float* keys, const float* values, size_t stride, size_t n, size_t hd,
                 float scale, float softcap, float* scores, float* out);

}  // namespace lowbit::kernels
