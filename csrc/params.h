// Plain, torch-free descriptions of what a launch works on. Strides are in elements.
#pragma once
#include <cstdint>

namespace maxsim {

enum Layout : int { kAllPairs = 0, kGrouped = 1, kPairs = 2 };

// A token set: rows of `dim` values split into segments (one per query or document).
// Padded: segment n starts at n * seg_stride and spans pad_len rows (lengths[n] of them valid).
// Packed: segment n spans rows offsets[n] .. offsets[n+1]-1.
struct TokenSet {
  const void* data = nullptr;
  int64_t row_stride = 0;        // elements between consecutive tokens
  int64_t seg_stride = 0;        // elements between consecutive padded segments
  const int* offsets = nullptr;  // packed only, [count + 1]
  const int* lengths = nullptr;  // padded only, optional, [count]
  const bool* mask = nullptr;    // optional, one flag per row (padded: [count, pad_len])
  int count = 0;                 // number of segments
  int pad_len = 0;               // padded rows per segment; 0 when packed
  int64_t rows = 0;              // rows in the whole set
};

// Which (query, document) pairs are scored and where each score goes.
struct PairMap {
  Layout layout = kAllPairs;
  int group = 1;                    // kGrouped: documents per query
  int num_pairs = 0;                // number of scores
  const int* pair_q = nullptr;      // kPairs
  const int* pair_d = nullptr;      // kPairs
};

// How documents are stored: in the queries' dtype, or as 8-bit codes with one scale per token.
// kInt8x8: queries int8 codes too, both passed as fp16 pairs of codes (q, d and dim in 16-bit
// elements, two codes each) for the integer tensor cores.
enum class Codes : int { kNone = 0, kInt8 = 1, kE4m3 = 2, kInt8x8 = 3 };

struct FwdParams {
  TokenSet q, d;
  Codes codes = Codes::kNone;
  const float* d_scale = nullptr;   // codes: one fp32 scale per document row
  const float* q_scale = nullptr;   // optional: one fp32 scale per query row (codes as values)
  PairMap pairs;
  int dim = 0;
  int max_lq = 0;                   // argmax row width
  float* scores = nullptr;          // [num_pairs]
  float* partial = nullptr;         // [m_tiles, num_pairs] when a query spans several row tiles
  int* argmax = nullptr;            // [num_pairs, max_lq] or null
  bool tf32 = false;                // fp32 rows: one TF32 product (opt-in) instead of split TF32
  // Hopper's wgmma tiles of 16-bit rows: TMA descriptors (CUtensorMap) of the document rows and
  // (stream tiles, padded queries) the query rows, each as one 2-D tensor [rows, dim], boxes of
  // 64 dims x the tile's rows with the 128-byte swizzle, where the host could build them.
  bool d_tma = false, q_tma = false;
  alignas(64) unsigned char d_tmap[128] = {};
  alignas(64) unsigned char q_tmap[128] = {};
};

// Which rows (of the tensor-core forward) a block owns and which documents it scores them against.
struct FwdGrid {
  int q_tiles;        // row tiles along the query side
  int m_tiles;        // row tiles per query (> 1 when Lq > BM)
  int qpb;            // queries per row tile (> 1 only for short padded queries, all-pairs)
  int docs_per_block; // documents (or pairs) per block
};

// Cross-entropy over the rows of fp32 scores [rows, cols] (row i's target: targets[i], or i).
struct CeParams {
  const float* scores = nullptr;
  const int64_t* targets = nullptr;  // [rows] or null (the diagonal)
  int rows = 0, cols = 0;
  float scale = 1.f;                 // logits = scores * scale (1 / temperature)
  float* row_loss = nullptr;         // [rows] scratch
  float* loss = nullptr;             // 0-d: mean over rows
  float* grad = nullptr;             // [rows, cols]: d loss / d scores
};

struct BwdParams {
  TokenSet q, d;
  PairMap pairs;
  int dim = 0;
  int max_lq = 0;
  const float* grad = nullptr;      // [num_pairs]
  const int* argmax = nullptr;      // [num_pairs, max_lq]
  // kPairs: pairs sorted by query / by document (stable), with CSR pointers.
  const int64_t* by_q = nullptr;
  const int64_t* q_ptr = nullptr;   // [q.count + 1]
  const int64_t* by_d = nullptr;
  const int64_t* d_ptr = nullptr;   // [d.count + 1]
  void* dq = nullptr;               // shaped like q
  void* dd = nullptr;               // shaped like d
  // dD by document row (padded documents): each row's argmax entries, in entry order.
  int* dd_sorted = nullptr;         // [num_pairs * max_lq] entry ids, grouped by row
  int* dd_start = nullptr;          // [d.rows] first position of the row's entries
  int* dd_count = nullptr;          // [d.rows] how many
  // The training step's fused loss (ce.rows > 0): the dQ kernel computes the gradient of the
  // scores (ce.scores) itself and writes it to ce.grad (which `grad` then points to) with the
  // row losses; the dD row kernel's first block writes their mean to ce.loss.
  CeParams ce;
};


}  // namespace maxsim

namespace maxsim {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

struct DeviceInfo {
  int sm = 0;        // compute capability, major * 10 + minor
  int num_sms = 0;
  int max_smem = 0;  // opt-in shared memory per block, bytes
  int dram_gbps = 0; // peak DRAM bandwidth (memory clock x bus width), 0 where unknown
};

}  // namespace maxsim
