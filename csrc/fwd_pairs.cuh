// The pair layouts of the tensor-core forward as policies: which documents a block's items are,
// which query they start from, and where each score goes. A block walks `items` (documents of
// all pairs, a query's group, or explicit pairs) from item_begin to item_end.
#pragma once
#include <climits>
#include <type_traits>
#include "layout.cuh"

namespace maxsim {

// Every query against every document: items are documents, the row tile names the queries.
struct AllPairsItems {
  __device__ static int first_query(const PairMap&, const FwdGrid& g, int qtile, int) {
    return (qtile / g.m_tiles) * g.qpb;
  }
  __device__ static int count(const PairMap&, int num_d) { return num_d; }
  __device__ static int doc(const PairMap&, int, int it) { return it; }
  __device__ static int64_t out(const PairMap&, int num_d, int it, int qi) {
    return static_cast<int64_t>(qi) * num_d + it;
  }
};

// Query q against its own group of documents q * group .. q * group + group - 1.
struct GroupedItems {
  __device__ static int first_query(const PairMap&, const FwdGrid& g, int qtile, int) {
    return qtile / g.m_tiles;
  }
  __device__ static int count(const PairMap& m, int) { return m.group; }
  __device__ static int doc(const PairMap& m, int q0, int it) { return q0 * m.group + it; }
  __device__ static int64_t out(const PairMap& m, int, int it, int qi) {
    return static_cast<int64_t>(qi) * m.group + it;
  }
};

// Explicit (query, document) pairs: items are pairs, each naming its query.
struct ExplicitPairItems {
  __device__ static int first_query(const PairMap& m, const FwdGrid&, int, int item) {
    return m.pair_q[item];
  }
  __device__ static int count(const PairMap& m, int) { return m.num_pairs; }
  __device__ static int doc(const PairMap& m, int, int it) { return m.pair_d[it]; }
  __device__ static int64_t out(const PairMap&, int, int it, int) { return static_cast<int64_t>(it); }
};

// Calls f with the policy of the call's layout. The layout stays a runtime value: one kernel
// instance serves all three (a template per layout would triple every tile's instances).
template <typename F>
__device__ __forceinline__ auto with_pair_items(Layout layout, F&& f) {
  if (layout == kAllPairs) return f(AllPairsItems{});
  if (layout == kGrouped) return f(GroupedItems{});
  return f(ExplicitPairItems{});
}

// The items a block owns (chunk `chunk` of docs_per_block), its first query, and its item -> doc
// and item -> score maps.
struct BlockItems {
  const PairMap& pm;
  int num_d;
  int q_end;       // writes(qi) iff qi < q_end: num_q, or INT_MAX for explicit pairs
  int begin, end;  // items [begin, end)
  int q0;          // first query of the row tile (explicit pairs: the query of the first item)

  __device__ __forceinline__ BlockItems(const PairMap& m, int nq, int nd, const FwdGrid& g, int qtile,
                                        int chunk)
      : pm(m), num_d(nd), q_end(m.layout == kPairs ? INT_MAX : nq) {
    begin = chunk * g.docs_per_block;
    end = min(with_pair_items(m.layout, [&](auto items) { return items.count(m, nd); }),
              begin + g.docs_per_block);
    q0 = with_pair_items(m.layout, [&](auto items) {
      if constexpr (std::is_same_v<decltype(items), ExplicitPairItems>)
        return begin < end ? items.first_query(m, g, qtile, begin) : 0;
      else
        return items.first_query(m, g, qtile, begin);
    });
  }
  __device__ __forceinline__ bool empty() const { return begin >= end; }
  // Whether query qi's rows have a score to write: explicit pairs always (an id out of range is
  // a NaN score), the other layouts for queries of the batch (not a tile's padding).
  __device__ __forceinline__ bool writes(int qi) const { return qi < q_end; }
  __device__ __forceinline__ int doc(int it) const {
    return with_pair_items(pm.layout, [&](auto items) { return items.doc(pm, q0, it); });
  }
  // Document n's segment (n = doc(it)): its id checked only for explicit pairs.
  __device__ __forceinline__ Segment doc_segment(const TokenSet& d, int n) const { return pair_segment(pm, d, n); }
  __device__ __forceinline__ int64_t out(int it, int qi) const {
    return with_pair_items(pm.layout, [&](auto items) { return items.out(pm, num_d, it, qi); });
  }
};

}  // namespace maxsim
