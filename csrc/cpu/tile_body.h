// The CPU forward's tile, written once for every vector instruction set: included by tile.h
// inside one namespace per ISA, where `V` names that ISA's vector policy (simd_*.h) and the
// target pragma around the include lets the compiler use its instructions (no include guard).
//
// kV query vectors (V::kLanes query tokens each) x kJ document tokens per register block: the
// similarities stay in registers and are folded into the running per-lane max, argmax (strictly
// greater: the lowest index wins ties) and NaN flag, so no horizontal reduction runs in the loop.
// A step is V::kPair dimensions: 1 for fp32 FMAs, 2 for bf16 pair dot products.

template <int kV, int kJ, bool kArg>
MAXSIM_ALWAYS_INLINE inline void fold_block(const typename V::QElem* const* qv, int64_t h,
                                            const typename V::DElem* const* rows, const int* tok,
                                            typename V::F* m, typename V::I* a,
                                            typename V::I* f) {
  typename V::F acc[kJ][kV];
  for (int j = 0; j < kJ; ++j)
    for (int v = 0; v < kV; ++v) acc[j][v] = V::zero();
  const int64_t steps = h / V::kPair;
  for (int64_t s = 0; s < steps; ++s) {
    typename V::B b[kV];
    for (int v = 0; v < kV; ++v) b[v] = V::load_query(qv[v] + s * V::kLanes * V::kPair);
    for (int j = 0; j < kJ; ++j) {
      const typename V::X x = V::broadcast(rows[j] + s * V::kPair);
      for (int v = 0; v < kV; ++v) acc[j][v] = V::madd(acc[j][v], x, b[v]);
    }
  }
  if (V::kPair > 1 && steps * V::kPair < h) {  // odd h: the last dimension alone, paired with 0
    typename V::B b[kV];
    for (int v = 0; v < kV; ++v) b[v] = V::load_query(qv[v] + steps * V::kLanes * V::kPair);
    for (int j = 0; j < kJ; ++j) {
      const typename V::X x = V::broadcast_last(rows[j] + h - 1);
      for (int v = 0; v < kV; ++v) acc[j][v] = V::madd(acc[j][v], x, b[v]);
    }
  }
  for (int j = 0; j < kJ; ++j) {
    const typename V::I t = V::splat_int(tok[j]);
    for (int v = 0; v < kV; ++v) V::template fold<kArg>(acc[j][v], t, m[v], a[v], f[v]);
  }
}

// The last kJ < V::kTokenBlock tokens of a run, kJ turned into a template argument.
template <int kV, bool kArg, int kJ = V::kTokenBlock - 1>
MAXSIM_ALWAYS_INLINE inline void fold_tail(int n, const typename V::QElem* const* qv, int64_t h,
                                           const typename V::DElem* const* rows, const int* tok,
                                           typename V::F* m, typename V::I* a, typename V::I* f) {
  if constexpr (kJ > 0) {
    if (n == kJ) return fold_block<kV, kJ, kArg>(qv, h, rows, tok, m, a, f);
    fold_tail<kV, kArg, kJ - 1>(n, qv, h, rows, tok, m, a, f);
  }
}

// Query vectors [v0, v0 + kV) of `qt` against the tokens rows[0 .. n), indices tok[0 .. n).
template <int kV, bool kArg>
void fold_run(const typename V::QElem* qt, int64_t h, int v0, const typename V::DElem* const* rows,
              const int* tok, int n, RowState s) {
  const typename V::QElem* qv[kV];
  typename V::F m[kV];
  typename V::I a[kV], f[kV];
  for (int v = 0; v < kV; ++v) {
    const int i = (v0 + v) * V::kLanes;
    qv[v] = qt + (v0 + v) * query_vector_elems(h, V::kLanes, V::kPair);
    m[v] = V::load(s.max + i);
    f[v] = V::load_int(s.nan + i);
    a[v] = kArg ? V::load_int(s.arg + i) : V::splat_int(0);
  }
  int j = 0;
  for (; j + V::kTokenBlock <= n; j += V::kTokenBlock)
    fold_block<kV, V::kTokenBlock, kArg>(qv, h, rows + j, tok + j, m, a, f);
  fold_tail<kV, kArg>(n - j, qv, h, rows + j, tok + j, m, a, f);
  for (int v = 0; v < kV; ++v) {
    const int i = (v0 + v) * V::kLanes;
    V::store(s.max + i, m[v]);
    V::store_int(s.nan + i, f[v]);
    if (kArg) V::store_int(s.arg + i, a[v]);
  }
}

// The last kV < V::kMaxVectors query vectors, kV turned into a template argument.
template <bool kArg, int kV = V::kMaxVectors - 1>
MAXSIM_ALWAYS_INLINE inline void fold_last_vectors(int left, const typename V::QElem* qt, int64_t h,
                                                   int v0, const typename V::DElem* const* rows,
                                                   const int* tok, int n, RowState s) {
  if constexpr (kV > 0) {
    if (left == kV) return fold_run<kV, kArg>(qt, h, v0, rows, tok, n, s);
    fold_last_vectors<kArg, kV - 1>(left, qt, h, v0, rows, tok, n, s);
  }
}

template <bool kArg>
void fold_all(const void* qt_raw, int64_t h, int nv, const void* const* rows_raw, const int* tok,
              int n, RowState s) {
  const auto* qt = static_cast<const typename V::QElem*>(qt_raw);
  const auto* rows = reinterpret_cast<const typename V::DElem* const*>(rows_raw);
  int v = 0;
  for (; v + V::kMaxVectors <= nv; v += V::kMaxVectors)
    fold_run<V::kMaxVectors, kArg>(qt, h, v, rows, tok, n, s);
  fold_last_vectors<kArg>(nv - v, qt, h, v, rows, tok, n, s);
}

// The entry point of this ISA's tile: query vectors [0, nv) against the tokens rows[0 .. n).
inline void fold_tokens(const void* qt, int64_t h, int nv, const void* const* rows,
                        const int* tok, int n, RowState s) {
  if (s.arg) fold_all<true>(qt, h, nv, rows, tok, n, s);
  else fold_all<false>(qt, h, nv, rows, tok, n, s);
}
