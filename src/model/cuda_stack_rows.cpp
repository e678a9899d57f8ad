// stack_rows (src/model/cuda/stack_rows.h): concatenates each stored array along its leading dimension, then
// checks the result by decoding the first and last row of every part. Plain host code, so CPU tests cover it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "lowbit/core/error.h"
#include "cuda/stack_rows.h"

namespace lowbit::model {

namespace {

bool same_rows(const codec::TensorRef& stacked, int64_t at, const codec::TensorRef& part, int64_t row) {
  const int64_t cols = part.shape[1];
  std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
  stacked.codec->decode_rows(stacked.params, stacked.shape, stacked.arrays, at + row, at + row + 1, a.data());
  part.codec->decode_rows(part.params, part.shape, part.arrays, row, row + 1, b.data());
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

std::optional<StackedTensor> stack_rows(std::span<const codec::TensorRef* const> parts) {
  if (parts.empty()) return std::nullopt;
  const codec::TensorRef& first = *parts.front();
  if (first.shape.size() != 2) return std::nullopt;
  int64_t rows = 0;
  for (const codec::TensorRef* p : parts) {
    if (p->codec != first.codec || p->params != first.params || p->shape.size() != 2 || p->shape[1] != first.shape[1])
      return std::nullopt;
    rows += p->shape[0];
  }
  const codec::Codec& c = *first.codec;
  const Shape shape{rows, first.shape[1]};
  try {
    c.validate(first.params, shape);
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::vector<codec::ArraySpec> specs = c.arrays(first.params, shape);
  StackedTensor out;
  out.encoded.params = first.params;
  for (const codec::ArraySpec& spec : specs) {
    if (spec.shape.empty()) return std::nullopt;
    TensorBuffer buffer = make_buffer(spec.dtype, spec.shape);
    size_t offset = 0;
    for (const codec::TensorRef* p : parts) {
      const TensorView* view = nullptr;
      for (const auto& [role, v] : p->arrays.items)
        if (role == spec.role) view = &v;
      if (!view || view->dtype != spec.dtype || view->shape.size() != spec.shape.size() ||
          !std::equal(spec.shape.begin() + 1, spec.shape.end(), view->shape.begin() + 1) ||
          offset + view->bytes.size() > buffer.bytes.size())
        return std::nullopt;
      std::memcpy(buffer.bytes.data() + offset, view->bytes.data(), view->bytes.size());
      offset += view->bytes.size();
    }
    if (offset != buffer.bytes.size()) return std::nullopt;
    out.encoded.arrays.emplace_back(spec.role, std::move(buffer));
  }
  out.ref = {&c, first.params, shape, out.encoded.views()};
  int64_t at = 0;
  for (const codec::TensorRef* p : parts) {
    if (!same_rows(out.ref, at, *p, 0) || !same_rows(out.ref, at, *p, p->shape[0] - 1)) return std::nullopt;
    at += p->shape[0];
  }
  return out;
}

}  // namespace lowbit::model
