// The CPU backward (dQ, dD from the forward's argmax), the loss and the training step.
//
// Each query segment's dQ and each document segment's dD is owned by one thread, which sums its
// pairs' contributions in pair order in fp32 and rounds once: gradients are bit-identical run
// after run and thread count, with no atomics.
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "cpu/ops.h"
#include "cpu/threads.h"
#include "cpu/tile.h"
#include "cpu/token_sets.h"
#include "params.h"

namespace maxsim::cpu {
namespace {

// The pairs of each segment of one side, in pair order (CSR).
struct PairLists {
  std::vector<int64_t> start, pair;
};

PairLists group_by(const int* ids, int64_t pairs, int64_t count) {
  PairLists l;
  l.start.assign(count + 1, 0);
  for (int64_t p = 0; p < pairs; ++p)
    if (ids[p] >= 0 && ids[p] < count) ++l.start[ids[p] + 1];
  for (int64_t n = 0; n < count; ++n) l.start[n + 1] += l.start[n];
  l.pair.resize(l.start[count]);
  std::vector<int64_t> fill(l.start.begin(), l.start.end() - 1);
  for (int64_t p = 0; p < pairs; ++p)
    if (ids[p] >= 0 && ids[p] < count) l.pair[fill[ids[p]]++] = p;
  return l;
}

struct BwdCall {
  const Segments* q;
  const Segments* d;
  int64_t layout, group, width, pairs;
  const int* pair_q;
  const int* pair_d;
  const float* grad;
  const int* argmax;
  PairLists by_q, by_d;  // kPairs only
};

// Calls f(pair, other side's segment) for every pair of segment n of one side, in pair order.
template <typename F>
void for_pairs_of(const BwdCall& c, bool query_side, int64_t n, const F& f) {
  const int64_t nq = c.q->count, nd = c.d->count;
  if (c.layout == kAllPairs) {
    if (query_side) for (int64_t j = 0; j < nd; ++j) f(n * nd + j, j);
    else for (int64_t i = 0; i < nq; ++i) f(i * nd + n, i);
  } else if (c.layout == kGrouped) {
    if (query_side) for (int64_t p = n * c.group; p < (n + 1) * c.group; ++p) f(p, p);
    else f(n, n / c.group);
  } else {
    const PairLists& l = query_side ? c.by_q : c.by_d;
    const int* other = query_side ? c.pair_d : c.pair_q;
    const int64_t count = query_side ? nd : nq;
    for (int64_t k = l.start[n]; k < l.start[n + 1]; ++k)
      if (other[l.pair[k]] >= 0 && other[l.pair[k]] < count) f(l.pair[k], other[l.pair[k]]);
  }
}

#ifdef MAXSIM_CPU_X86
__attribute__((target("avx2,fma"))) void add_scaled_avx2(float* acc, float g, const float* x,
                                                          int64_t h) {
  const __m256 gv = _mm256_set1_ps(g);
  int64_t k = 0;
  for (; k + 8 <= h; k += 8)
    _mm256_storeu_ps(acc + k, _mm256_fmadd_ps(gv, _mm256_loadu_ps(x + k), _mm256_loadu_ps(acc + k)));
  for (; k < h; ++k) acc[k] = std::fma(g, x[k], acc[k]);
}
#endif

// acc += g * x, one fused multiply-add per element on every path (AVX2, else std::fma, which the
// compiler vectorizes where FMA units exist and a CPU without them emulates): gradients are
// bit-identical run after run, thread count and ISA.
void add_scaled(float* acc, float g, const float* x, int64_t h) {
#ifdef MAXSIM_CPU_X86
  static const bool avx2 = cpu_has(Isa::kAvx2);
  if (avx2 && active_isa() != Isa::kScalar) return add_scaled_avx2(acc, g, x, h);
#endif
  for (int64_t k = 0; k < h; ++k) acc[k] = std::fma(g, x[k], acc[k]);
}

// acc += g * row (fp32), the row converted through `tmp` unless it is fp32 already.
void add_row(float* acc, float g, const Segments& s, int64_t row, float* tmp, int64_t h) {
  const float* x = reinterpret_cast<const float*>(s.row(row));
  if (!s.is_fp32()) {
    to_fp32(s.row(row), s.dtype, h, tmp);
    x = tmp;
  }
  add_scaled(acc, g, x, h);
}

// Segment n's gradient on one side, summed in fp32 into `acc` (resized to its rows x h); returns
// its rows, or -1 where its index values are out of range (its pairs have no argmax, and its
// clamped rows may be another segment's).
int64_t segment_grad(const BwdCall& c, bool query_side, int64_t n, std::vector<float>& acc, float* tmp) {
  const Segments& own = query_side ? *c.q : *c.d;
  const Segments& other = query_side ? *c.d : *c.q;
  const int64_t h = own.h;
  if (own.out_of_range(n, query_side && own.packed ? c.width : -1)) return -1;
  const int64_t len = query_side ? std::min(own.length(n), c.width) : own.length(n);
  acc.assign(len * h, 0.f);
  for_pairs_of(c, query_side, n, [&](int64_t p, int64_t m) {
    const float g = c.grad[p];
    const int64_t q_len = std::min(query_side ? len : other.length(m), c.width);
    const int64_t d_len = query_side ? other.length(m) : len;
    for (int64_t i = 0; i < q_len; ++i) {
      const int j = c.argmax[p * c.width + i];
      if (j < 0 || j >= d_len) continue;  // no winner, or an unchecked bad index
      if (query_side) add_row(acc.data() + i * h, g, other, other.begin(m) + j, tmp, h);
      else add_row(acc.data() + j * h, g, other, other.begin(m) + i, tmp, h);
    }
  });
  return len;
}

// dQ and dD (zero-filled, shaped like each side's tokens): every segment of both sides handed out
// to the threads together, each written once. A side whose packed offsets decrease somewhere
// can have two in-range segments sharing rows: its gradients add up, one segment at a time.
void grads(const BwdCall& c, at::Tensor& dq, at::Tensor& dd) {
  const int64_t h = c.q->h;
  struct Scratch {
    std::vector<float> acc, tmp;
  };
  const auto make_scratch = [&] { return Scratch{{}, std::vector<float>(h)}; };
  const bool q_shared = c.q->offsets_decrease(), d_shared = c.d->offsets_decrease();
  const int64_t nq = q_shared ? 0 : c.q->count, nd = d_shared ? 0 : c.d->count;
  char* q_base = static_cast<char*>(dq.data_ptr());
  char* d_base = static_cast<char*>(dd.data_ptr());
  for_each_grab(nq + nd, make_scratch, [&](int64_t i0, int64_t i1, Scratch& s) {
    for (int64_t i = i0; i < i1; ++i) {
      const bool query_side = i < nq;
      const int64_t n = query_side ? i : i - nq;
      const int64_t len = segment_grad(c, query_side, n, s.acc, s.tmp.data());
      const Segments& own = query_side ? *c.q : *c.d;
      // Written straight into the output's rows: no ATen call per segment.
      char* rows = (query_side ? q_base : d_base) + own.begin(n) * h * own.elem;
      if (len > 0) from_fp32(s.acc.data(), own.dtype, len * h, rows);
    }
  });
  if (!q_shared && !d_shared) return;
  Scratch s = make_scratch();
  for (const bool query_side : {true, false}) {
    if (!(query_side ? q_shared : d_shared)) continue;
    const Segments& own = query_side ? *c.q : *c.d;
    at::Tensor rows = (query_side ? dq : dd).view({-1, h});
    for (int64_t n = 0; n < own.count; ++n) {
      const int64_t len = segment_grad(c, query_side, n, s.acc, s.tmp.data());
      if (len > 0) rows.narrow(0, own.begin(n), len).add_(at::from_blob(s.acc.data(), {len, h}, at::kFloat));
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> bwd(const Tensor& grad, const Tensor& q_in, const Tensor& d_in,
                               const Tensor& argmax, const OptTensor& q_offsets,
                               const OptTensor& d_offsets, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group) {
  check_pair(q_in, d_in);
  const Tensor q = q_in.contiguous(), d = d_in.contiguous();
  const Segments qs(q, q_offsets, std::nullopt, std::nullopt, "queries");
  const Segments ds(d, d_offsets, std::nullopt, std::nullopt, "documents");
  const std::vector<int64_t> shape = scores_shape(qs, ds, pair_q, pair_d, layout, group);
  TORCH_CHECK(argmax.scalar_type() == at::kInt && argmax.is_contiguous() && argmax.device().is_cpu(),
              "maxsim: argmax must be a contiguous CPU int32 tensor");
  TORCH_CHECK(argmax.dim() == static_cast<int64_t>(shape.size()) + 1, "maxsim: argmax has the wrong rank");
  const Tensor g = grad.to(at::kFloat).contiguous();
  BwdCall c{&qs, &ds, layout, group, argmax.size(-1), g.numel(), nullptr, nullptr,
            g.data_ptr<float>(), argmax.data_ptr<int>(), {}, {}};
  int64_t pairs = 1;
  for (int64_t s : shape) pairs *= s;
  TORCH_CHECK(c.pairs == pairs, "maxsim: grad must have one value per score");
  TORCH_CHECK(argmax.numel() == pairs * c.width, "maxsim: argmax must be scores.shape + [max_lq]");
  if (q.dim() == 3) TORCH_CHECK(c.width == q.size(1), "maxsim: argmax width must equal the padded query length");
  if (layout == kPairs) {
    c.pair_q = pair_q->data_ptr<int>();
    c.pair_d = pair_d->data_ptr<int>();
    c.by_q = group_by(c.pair_q, pairs, qs.count);
    c.by_d = group_by(c.pair_d, pairs, ds.count);
  }
  // Accumulated in fp32 per segment, then rounded once into the inputs' dtype.
  Tensor dq = at::zeros(q.sizes(), q.options());
  Tensor dd = at::zeros(d.sizes(), d.options());
  if (pairs > 0 && c.width > 0 && q.size(-1) > 0) grads(c, dq, dd);
  return {dq, dd};
}

std::tuple<Tensor, Tensor> ce(const Tensor& scores_in, const OptTensor& targets, double scale) {
  TORCH_CHECK(scores_in.dim() == 2, "maxsim: ce expects scores [rows, cols]");
  const Tensor logits = scores_in.to(at::kFloat) * scale;
  const int64_t rows = logits.size(0);
  if (rows == 0) return {at::full({}, NAN, logits.options()), at::empty_like(logits)};
  const Tensor t = targets.has_value() ? targets->to(at::kLong)
                                       : at::arange(rows, logits.options().dtype(at::kLong));
  TORCH_CHECK(t.numel() == rows, "maxsim: ce targets must be [rows]");
  // Unchecked targets outside [0, cols): the loss NaN, the row's gradient 0, nothing read.
  const int64_t cols = logits.size(1);
  const Tensor outside = (t < 0).logical_or(t >= cols).view({rows, 1});
  if (cols == 0) return {at::full({}, NAN, logits.options()), at::zeros_like(logits)};
  const Tensor tc = t.clamp(0, cols - 1).view({rows, 1});
  const Tensor logp = at::log_softmax(logits, 1);
  Tensor loss = -logp.gather(1, tc).mean();
  loss = at::where(outside.any(), at::full({}, NAN, loss.options()), loss);
  Tensor g = logp.exp();
  g.scatter_add_(1, tc, at::full({rows, 1}, -1.f, g.options()));
  return {loss, g.masked_fill_(outside, 0.f) * (scale / rows)};
}

std::tuple<Tensor, Tensor, Tensor> contrastive_step(
    const Tensor& q, const Tensor& d, const OptTensor& q_offsets, const OptTensor& q_lengths,
    const OptTensor& q_mask, const OptTensor& d_offsets, const OptTensor& d_lengths,
    const OptTensor& d_mask, int64_t layout, int64_t group, int64_t max_lq,
    const OptTensor& targets, double scale) {
  TORCH_CHECK(layout != kPairs, "maxsim: contrastive_step takes all-pairs or grouped scores");
  auto [scores, argmax] = fwd(q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask,
                              std::nullopt, std::nullopt, layout, group, max_lq, true, false);
  auto [loss, grad] = ce(scores, targets, scale);
  auto [dq, dd] = bwd(grad, q, d, argmax, q_offsets, d_offsets, std::nullopt, std::nullopt,
                      layout, group);
  return {loss, dq, dd};
}

}  // namespace maxsim::cpu
