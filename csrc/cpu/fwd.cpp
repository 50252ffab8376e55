// The CPU forward: every layout, padded and packed token sets, lengths, masks, argmax.
//
// Queries are packed once per call (valid tokens only, transposed: the layout of the tile that
// this CPU's ISA and the dtype choose, tile.h); each work item is one document against the
// queries it is paired with. The document's valid tokens are copied a chunk at a time (as
// stored for the bf16 tile, else converted to fp32) and folded into every
// paired query's running max, so similarities never reach memory. Work items are handed out
// dynamically (threads.h): documents differ in length, and other processes may hold a core.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "cpu/ops.h"
#include "cpu/threads.h"
#include "cpu/tile.h"
#include "cpu/token_sets.h"
#include "params.h"

namespace maxsim::cpu {
namespace {

// The transposed queries of a call (or of a slab of its queries), in the tile's layout.
struct QueryPack {
  Tile tile;
  int64_t h = 0;
  std::vector<int64_t> start;  // per query: first float in `qt`
  std::vector<int> count;      // per query: valid tokens packed
  std::vector<int> token;      // per packed token: its index in the query
  std::vector<int64_t> token_start;
  std::vector<float> qt;       // fp32 tiles
  std::vector<uint16_t> qt16;  // the bf16 tile

  int vectors(int64_t i) const { return (count[i] + tile.lanes - 1) / tile.lanes; }
  int64_t vector_elems() const { return query_vector_elems(h, tile.lanes, tile.pair); }
  // Query i's packed vectors, and those from its packed token c's vector on.
  const void* of(int64_t i, int c = 0) const {
    const int64_t e = start[i] + int64_t(c / tile.lanes) * vector_elems();
    return tile.bf16_rows() ? static_cast<const void*>(qt16.data() + e)
                            : static_cast<const void*>(qt.data() + e);
  }
};

// Packs queries [q0, q1): valid tokens < max_lq, transposed into the tile's vectors, zero-padded.
QueryPack pack_queries(const Segments& q, int64_t q0, int64_t q1, int64_t max_lq, Tile tile) {
  QueryPack p;
  p.tile = tile;
  p.h = q.h;
  const int64_t n = q1 - q0;
  p.start.resize(n + 1);
  p.token_start.resize(n + 1);
  p.count.resize(n);
  std::vector<int> tokens;
  int64_t floats = 0;
  for (int64_t i = 0; i < n; ++i) {
    p.start[i] = floats;
    p.token_start[i] = static_cast<int64_t>(p.token.size());
    const int64_t len = std::min<int64_t>(q.length(q0 + i), max_lq);
    for (int64_t t = 0; t < len; ++t)
      if (q.valid(q0 + i, t)) p.token.push_back(static_cast<int>(t));
    p.count[i] = static_cast<int>(p.token.size() - p.token_start[i]);
    floats += int64_t(p.vectors(i)) * p.vector_elems();
  }
  p.start[n] = floats;
  p.token_start[n] = static_cast<int64_t>(p.token.size());
  if (tile.bf16_rows()) p.qt16.assign(floats, 0);
  else p.qt.assign(floats, 0.f);
  std::vector<float> row(q.h);
  for (int64_t i = 0; i < n; ++i) {
    const int* tok = p.token.data() + p.token_start[i];
    void* dst = const_cast<void*>(p.of(i));
    for (int c = 0; c < p.count[i]; ++c) {
      q.row_fp32(q0 + i, tok[c], row.data());  // bf16 -> fp32 is exact: the bf16 tile's bits
      store_query_token(tile, q.h, c, row.data(), dst);
    }
  }
  return p;
}

// One (query, score slot) a document is scored against.
struct Target {
  int64_t query;  // index into the QueryPack; -1: an unscorable pair (id out of range)
  int64_t slot;   // index of the score
};

// Per-thread scratch: the document chunk's row table (and fp32 copy), the running states.
struct Scratch {
  std::vector<const void*> rows;
  std::vector<int> tok;
  std::vector<float> converted;
  std::vector<float> max;
  std::vector<int> arg, nan;
};

struct FwdCall {
  const Segments* q;
  const Segments* d;
  const QueryPack* pack;
  int64_t max_lq;
  float* scores;
  int* argmax;  // [slots, max_lq] prefilled with -1, or null
  int64_t chunk;  // document tokens per chunk
  Tile tile;
};

// The similarities of packed query token `c` of `query` with the document's tokens, in order,
// each made by the tile on its own (the same arithmetic as the scores); returns the index of the
// first NaN (the argmax of a NaN score).
int first_nan_token(const FwdCall& call, int64_t query, int c, int64_t doc, Scratch& s) {
  const QueryPack& p = *call.pack;
  const int64_t len = call.d->length(doc);
  const int lane = c % p.tile.lanes;
  std::vector<float> max(p.tile.lanes);
  std::vector<int> nan(p.tile.lanes);
  for (int64_t t0 = 0; t0 < len; t0 += call.chunk) {
    const int n = call.d->gather_rows(doc, t0, std::min(len, t0 + call.chunk), s.rows.data(),
                                      s.tok.data(), s.converted.data(), p.tile.bf16_rows());
    for (int j = 0; j < n; ++j) {
      std::fill(max.begin(), max.end(), -std::numeric_limits<float>::infinity());
      std::fill(nan.begin(), nan.end(), 0);
      fold_tokens(p.tile, p.of(query, c), p.h, 1, s.rows.data() + j, s.tok.data() + j, 1,
                  RowState{max.data(), nullptr, nan.data()});
      if (nan[lane] != 0) return s.tok[j];
    }
  }
  return -1;
}

// Scores document `doc` against `targets`: one pass over its tokens, chunk by chunk.
void score_document(const FwdCall& call, int64_t doc, const Target* targets, int nt, Scratch& s) {
  const QueryPack& p = *call.pack;
  std::vector<int64_t> state(nt + 1, 0);  // first state entry of each target
  for (int t = 0; t < nt; ++t)
    state[t + 1] = state[t] + (targets[t].query < 0 ? 0 : p.vectors(targets[t].query) * p.tile.lanes);
  s.max.assign(state[nt], -std::numeric_limits<float>::infinity());
  s.arg.assign(state[nt], -1);
  s.nan.assign(state[nt], 0);
  const bool doc_ok = doc >= 0 && doc < call.d->count;
  const int64_t len = doc_ok ? call.d->length(doc) : 0;
  int first_valid = -1;
  for (int64_t t0 = 0; t0 < len; t0 += call.chunk) {
    const int n = call.d->gather_rows(doc, t0, std::min(len, t0 + call.chunk), s.rows.data(),
                                      s.tok.data(), s.converted.data(), p.tile.bf16_rows());
    if (n == 0) continue;
    if (first_valid < 0) first_valid = s.tok[0];
    for (int t = 0; t < nt; ++t) {
      if (targets[t].query < 0) continue;
      const int64_t i = targets[t].query, e = state[t];
      const RowState rs{s.max.data() + e, call.argmax ? s.arg.data() + e : nullptr,
                        s.nan.data() + e};
      fold_tokens(p.tile, p.of(i), p.h, p.vectors(i), s.rows.data(), s.tok.data(), n, rs);
    }
  }
  for (int t = 0; t < nt; ++t) {
    const Target& g = targets[t];
    if (g.query < 0 || !doc_ok) {  // what an unchecked bad id gives: NaN, argmax -1
      call.scores[g.slot] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float score = 0.f;
    const int* qtok = p.token.data() + p.token_start[g.query];
    for (int c = 0; first_valid >= 0 && c < p.count[g.query]; ++c) {
      const int64_t e = state[t] + c;
      const bool is_nan = s.nan[e] != 0;
      score += is_nan ? std::numeric_limits<float>::quiet_NaN() : s.max[e];
      if (call.argmax == nullptr) continue;
      // No strictly greater value than -inf: every similarity is -inf, the first token wins.
      int winner = s.arg[e] >= 0 ? s.arg[e] : first_valid;
      if (is_nan) winner = first_nan_token(call, g.query, c, doc, s);
      call.argmax[g.slot * call.max_lq + qtok[c]] = winner;
    }
    call.scores[g.slot] = score;
  }
}

int64_t memory_budget_bytes() {
  const char* raw = std::getenv("MAXSIM_TORCH_MEMORY_MB");
  const double mb = raw && *raw ? std::atof(raw) : 128.0;
  return static_cast<int64_t>((mb > 0 ? mb : 128.0) * 1048576.0);
}

// Runs `work(item, scratch)` for items [0, n), each thread with its own scratch.
template <typename Work>
void for_each_item(int64_t n, const Segments& d, int64_t chunk, const Work& work) {
  const auto make_scratch = [&] {
    Scratch s;
    s.rows.resize(chunk);
    s.tok.resize(chunk);
    s.converted.resize(chunk * d.h);
    return s;
  };
  for_each_grab(n, make_scratch, [&](int64_t i0, int64_t i1, Scratch& s) {
    for (int64_t i = i0; i < i1; ++i) work(i, s);
  });
}

// Every query of [q0, q1) against every document: an item is one document and a block of queries.
void fwd_allpairs(FwdCall& call, int64_t q0, int64_t q1, int64_t nd) {
  const int64_t nq = q1 - q0;
  const int64_t blocks = std::min<int64_t>(nq, std::max<int64_t>(1, 4 * at::get_num_threads() / std::max<int64_t>(nd, 1)));
  const int64_t per_block = (nq + blocks - 1) / blocks;
  for_each_item(nd * blocks, *call.d, call.chunk, [&](int64_t item, Scratch& s) {
    const int64_t doc = item / blocks, b0 = (item % blocks) * per_block;
    std::vector<Target> targets;
    for (int64_t i = b0; i < std::min(nq, b0 + per_block); ++i)
      targets.push_back({i, (q0 + i) * nd + doc});
    score_document(call, doc, targets.data(), static_cast<int>(targets.size()), s);
  });
}

// One document per score: grouped candidates or explicit pairs.
void fwd_paired(FwdCall& call, int64_t pairs, int64_t layout, int64_t group, const int* pair_q,
                const int* pair_d) {
  const int64_t nq = call.q->count;
  for_each_item(pairs, *call.d, call.chunk, [&](int64_t p, Scratch& s) {
    int64_t qi = layout == kGrouped ? p / group : pair_q[p];
    const int64_t doc = layout == kGrouped ? p : pair_d[p];
    if (qi < 0 || qi >= nq) qi = -1;
    const Target target{qi, p};
    score_document(call, doc, &target, 1, s);
  });
}

// Scores every slot of the call's layout.
void score_all(FwdCall& call, int64_t slots, int64_t layout, int64_t group, const int* pair_q,
               const int* pair_d) {
  const Segments& qs = *call.q;
  if (layout == kAllPairs) {
    // Queries are packed a slab at a time so that the packed copy stays within half the budget.
    const int64_t per_query = (call.max_lq + call.tile.lanes) * std::max<int64_t>(qs.h + 1, 1) * 4;
    const int64_t slab = std::max<int64_t>(1, memory_budget_bytes() / 2 / per_query);
    for (int64_t q0 = 0; q0 < qs.count; q0 += slab) {
      const int64_t q1 = std::min(qs.count, q0 + slab);
      const QueryPack pack = pack_queries(qs, q0, q1, call.max_lq, call.tile);
      call.pack = &pack;
      fwd_allpairs(call, q0, q1, call.d->count);
    }
    return;
  }
  const QueryPack pack = pack_queries(qs, 0, qs.count, call.max_lq, call.tile);
  call.pack = &pack;
  fwd_paired(call, slots, layout, group, pair_q, pair_d);
}

// Marks the scores that unchecked index values leave unscorable (docs/ARCHITECTURE.md, "Index
// values the kernels check themselves"): NaN, argmax -1. A few compares per segment and pair.
void mark_out_of_range(const Segments& q, const Segments& d, int64_t layout, int64_t group,
                       const int* pair_q, const int* pair_d, int64_t max_lq, float* scores,
                       int* argmax, int64_t slots) {
  std::vector<char> q_bad(q.count), d_bad(d.count);
  bool any = layout == kPairs;
  for (int64_t n = 0; n < q.count; ++n) any |= q_bad[n] = q.out_of_range(n, q.packed ? max_lq : -1);
  for (int64_t n = 0; n < d.count; ++n) any |= d_bad[n] = d.out_of_range(n);
  for (int64_t p = 0; any && p < slots; ++p) {
    const int64_t qi = layout == kAllPairs ? p / d.count : layout == kGrouped ? p / group : pair_q[p];
    const int64_t di = layout == kAllPairs ? p % d.count : layout == kGrouped ? p : pair_d[p];
    if (qi >= 0 && qi < q.count && di >= 0 && di < d.count && !q_bad[qi] && !d_bad[di]) continue;
    scores[p] = std::numeric_limits<float>::quiet_NaN();
    if (argmax) std::fill_n(argmax + p * max_lq, max_lq, -1);
  }
}

}  // namespace

std::tuple<Tensor, Tensor> fwd(const Tensor& q_in, const Tensor& d_in, const OptTensor& q_offsets,
                               const OptTensor& q_lengths, const OptTensor& q_mask,
                               const OptTensor& d_offsets, const OptTensor& d_lengths,
                               const OptTensor& d_mask, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group,
                               int64_t max_lq, bool with_argmax, bool tf32) {
  (void)tf32;  // fp32 is always exact here
  check_pair(q_in, d_in);
  const Tile tile = tile_for(active_isa(), q_in.scalar_type() == at::kBFloat16);
  const Tensor q = q_in.contiguous(), d = d_in.contiguous();
  const Segments qs(q, q_offsets, q_lengths, q_mask, "queries");
  const Segments ds(d, d_offsets, d_lengths, d_mask, "documents");
  const std::vector<int64_t> shape = scores_shape(qs, ds, pair_q, pair_d, layout, group);
  if (q.dim() == 3) TORCH_CHECK(max_lq == q.size(1), "maxsim: max_lq must equal the padded query length");
  TORCH_CHECK(max_lq >= 0, "maxsim: max_lq must be >= 0");
  Tensor scores = at::zeros(shape, q.options().dtype(at::kFloat));
  std::vector<int64_t> ashape = shape;
  ashape.push_back(max_lq);
  Tensor argmax = with_argmax ? at::full(ashape, -1, q.options().dtype(at::kInt))
                              : at::empty({0}, q.options().dtype(at::kInt));
  const int* pq = pair_q ? pair_q->data_ptr<int>() : nullptr;
  const int* pd = pair_d ? pair_d->data_ptr<int>() : nullptr;
  int* am = with_argmax && argmax.numel() > 0 ? argmax.data_ptr<int>() : nullptr;
  if (scores.numel() > 0 && max_lq > 0) {
    FwdCall call{&qs, &ds, nullptr, max_lq, scores.data_ptr<float>(), am,
                 std::clamp<int64_t>(65536 / std::max<int64_t>(qs.h, 1), 16, 1024), tile};
    score_all(call, scores.numel(), layout, group, pq, pd);
  }
  mark_out_of_range(qs, ds, layout, group, pq, pd, max_lq, scores.data_ptr<float>(), am,
                    scores.numel());
  return {scores, argmax};
}

}  // namespace maxsim::cpu
