#include "lowbit/quant/allocate.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "lowbit/codec/trellis.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::quant {

namespace {

// Each item's candidate minimizing loss + lambda * bytes (ties to fewer bytes).
Allocation at_lambda(const std::vector<AllocationItem>& items, double lambda) {
  Allocation a;
  for (const auto& it : items) {
    size_t best = 0;
    double best_cost = std::numeric_limits<double>::infinity();
    for (size_t c = 0; c < it.bytes.size(); ++c) {
      const double cost = it.loss[c] + lambda * static_cast<double>(it.bytes[c]);
      if (cost < best_cost || (cost == best_cost && it.bytes[c] < it.bytes[best])) {
        best = c;
        best_cost = cost;
      }
    }
    a.choice.push_back(best);
    a.bytes += it.bytes[best];
    a.loss += it.loss[best];
  }
  return a;
}

struct Move {
  size_t item;
  size_t candidate;
};

// Applies the best improving change of one or two items that stays within the budget, while there is one.
void improve(const std::vector<AllocationItem>& items, uint64_t budget, Allocation& a) {
  auto delta_bytes = [&](const Move& m) {
    return static_cast<int64_t>(items[m.item].bytes[m.candidate]) -
           static_cast<int64_t>(items[m.item].bytes[a.choice[m.item]]);
  };
  auto delta_loss = [&](const Move& m) { return items[m.item].loss[m.candidate] - items[m.item].loss[a.choice[m.item]]; };
  for (int round = 0; round < 10000; ++round) {
    std::vector<Move> moves;
    for (size_t i = 0; i < items.size(); ++i)
      for (size_t c = 0; c < items[i].bytes.size(); ++c)
        if (c != a.choice[i]) moves.push_back({i, c});
    double best_gain = 1e-12;
    std::vector<Move> best_moves;
    const auto room = static_cast<int64_t>(budget) - static_cast<int64_t>(a.bytes);
    for (size_t x = 0; x < moves.size(); ++x) {
      if (delta_bytes(moves[x]) <= room && -delta_loss(moves[x]) > best_gain) {
        best_gain = -delta_loss(moves[x]);
        best_moves = {moves[x]};
      }
      for (size_t y = x + 1; y < moves.size(); ++y) {
        if (moves[y].item == moves[x].item) continue;
        const double gain = -(delta_loss(moves[x]) + delta_loss(moves[y]));
        if (gain > best_gain && delta_bytes(moves[x]) + delta_bytes(moves[y]) <= room) {
          best_gain = gain;
          best_moves = {moves[x], moves[y]};
        }
      }
    }
    if (best_moves.empty()) return;
    for (const Move& m : best_moves) {
      a.bytes = static_cast<uint64_t>(static_cast<int64_t>(a.bytes) + delta_bytes(m));
      a.loss += delta_loss(m);
      a.choice[m.item] = m.candidate;
    }
  }
}

// The sample's 16-row tiles, ascending, from a generator seeded by the seed and the tensor's name (FNV-1a), so a
// rerun measures the same rows; every tile when the tensor is too small to sample.
std::vector<int64_t> sampled_tiles(int64_t tiles, uint64_t seed, std::string_view tensor_name) {
  std::vector<int64_t> all(static_cast<size_t>(tiles));
  std::iota(all.begin(), all.end(), 0);
  const int64_t n = std::max(kMeasureMinTiles, (tiles + kMeasureTileFraction - 1) / kMeasureTileFraction);
  if (n >= tiles) return all;
  uint64_t hash = 14695981039346656037ull;
  for (const char c : tensor_name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::mt19937_64 rng(seed ^ hash);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

double plain_error(const std::vector<float>& w, const std::vector<float>& q, int64_t rows, const Hessian* h) {
  if (h && h->dim > 0) return hessian_loss(w, q, rows, *h);
  // Per row, then summed in row order: the same total whatever the thread count.
  const auto cols = static_cast<int64_t>(w.size()) / std::max<int64_t>(rows, 1);
  std::vector<double> partial(static_cast<size_t>(rows), 0.0);
  default_pool().parallel_for(static_cast<size_t>(rows), 16, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      double s = 0;
      for (auto i = static_cast<int64_t>(r) * cols; i < static_cast<int64_t>(r + 1) * cols; ++i)
        s += (static_cast<double>(w[i]) - q[i]) * (w[i] - q[i]);
      partial[r] = s;
    }
  });
  double loss = 0;
  for (const double p : partial) loss += p;
  return loss;
}

uint64_t stored_bytes(const codec::Codec& codec, const codec::Params& params, const Shape& shape) {
  uint64_t n = 0;
  for (const codec::ArraySpec& a : codec.arrays(params, shape))
    n += checked_numel(a.shape, "[allocate]") * dtype_size(a.dtype);
  return n;
}

}  // namespace

CandidateMeasure measure_candidate(const CodecChoice& choice, const Shape& shape, const float* w, const Hessian* h,
                                   uint64_t seed, std::string_view tensor_name) {
  const codec::Codec& codec = codec::codec_or_throw(choice.codec, tensor_name);
  const auto [rows, cols] = codec::matrix_dims(shape);
  codec::EncodeOptions eo;
  eo.seed = seed;
  eo.pool = &default_pool();  // rows (affine and kin) or trellis tiles over every core
  CandidateMeasure m;
  m.rows = m.sampled_rows = rows;
  if (!measured_on_sample(choice, shape)) {
    const std::vector<float> whole(w, w + rows * cols);
    const codec::EncodedTensor enc = codec.encode(choice.params, shape, whole.data(), eo);
    m.loss = plain_error(whole, codec::decode_all({&codec, enc.params, shape, enc.views()}), rows, h);
    for (const auto& [role, buffer] : enc.arrays) m.bytes += buffer.bytes.size();
    m.params = enc.params;
    return m;
  }
  const int64_t tile = codec::trellis::kTileDim;
  std::vector<float> sample;
  for (const int64_t t : sampled_tiles((rows + tile - 1) / tile, seed, tensor_name))
    sample.insert(sample.end(), w + t * tile * cols, w + std::min(rows, (t + 1) * tile) * cols);
  m.sampled_rows = static_cast<int64_t>(sample.size()) / cols;
  const Shape sample_shape{m.sampled_rows, cols};
  const codec::EncodedTensor enc = codec.encode(choice.params, sample_shape, sample.data(), eo);
  const std::vector<float> q = codec::decode_all({&codec, enc.params, sample_shape, enc.views()});
  m.loss = plain_error(sample, q, m.sampled_rows, h) * static_cast<double>(rows) / static_cast<double>(m.sampled_rows);
  // The whole tensor's arrays: the sample's parameters with the padding the whole shape takes.
  codec::Params whole = enc.params;
  whole.erase("padded_rows");
  whole.erase("padded_cols");
  const codec::trellis::Layout lay = codec::trellis::parse_layout(whole, shape);
  whole["padded_rows"] = lay.padded_rows;
  whole["padded_cols"] = lay.padded_cols;
  m.bytes = stored_bytes(codec, whole, shape);
  m.params = std::move(whole);
  return m;
}

bool measured_on_sample(const CodecChoice& choice, const Shape& shape) {
  if (choice.codec != "trellis") return false;
  const codec::trellis::Layout lay = codec::trellis::parse_layout(choice.params, shape);
  return lay.per_row_scale && !lay.rotate_output && lay.row_tiles() > kMeasureMinTiles;
}

Allocation allocate(const std::vector<AllocationItem>& items, uint64_t budget) {
  for (const auto& it : items)
    if (it.bytes.empty() || it.bytes.size() != it.loss.size())
      fail(Errc::internal, "[allocate] '{}' needs one loss per candidate", it.name);

  // A larger lambda prices bytes higher. Find the smallest lambda whose allocation fits.
  Allocation best = at_lambda(items, 0.0);
  if (best.bytes > budget) {
    double lo = 0.0, hi = 1.0;
    Allocation fit = at_lambda(items, hi);
    for (int i = 0; i < 200 && fit.bytes > budget; ++i) fit = at_lambda(items, hi *= 4.0);
    if (fit.bytes > budget) {
      // Even the most byte-averse choice is too large: take every item's smallest candidate.
      Allocation smallest;
      smallest.feasible = false;
      for (const auto& it : items) {
        const size_t c = static_cast<size_t>(std::min_element(it.bytes.begin(), it.bytes.end()) - it.bytes.begin());
        smallest.choice.push_back(c);
        smallest.bytes += it.bytes[c];
        smallest.loss += it.loss[c];
      }
      return smallest;
    }
    for (int i = 0; i < 100; ++i) {
      const double mid = 0.5 * (lo + hi);
      Allocation a = at_lambda(items, mid);
      if (a.bytes <= budget) {
        hi = mid;
        fit = std::move(a);
      } else {
        lo = mid;
      }
    }
    best = std::move(fit);
  }
  // The sweep can leave budget unused between two lambdas, and small problems have a gap to the optimum:
  // improve by local search over single changes and pairs of changes that fit, best loss reduction first.
  improve(items, budget, best);
  return best;
}

}  // namespace lowbit::quant
