// Forward launcher: picks the kernel and tile shape for a problem, sizes the grid, launches.
#include <cuda.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include "fwd_launch.cuh"
#include "fwd_simt.cuh"

namespace maxsim {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, looked up once through the runtime (no link to libcuda).
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A token set as one 2-D tensor [rows, dim] for the wgmma tiles' TMA loads: boxes of 64 dims
// (the 128-byte swizzle span) x `box_rows` tokens, swizzled the way wgmma reads them, into `out`.
// Needs segments that follow each other row after row (packed, or padded without gaps), 16-byte
// row pitch and base, and row indices that fit an int; otherwise false, and the tile copies with
// cp.async.
bool encode_rows(const TokenSet& s, int dim, DType dtype, int box_rows, unsigned char (&out)[128]) {
  const int64_t rows = stored_rows(s);
  if (s.offsets == nullptr && s.seg_stride != int64_t(s.pad_len) * s.row_stride) return false;
  const uint64_t pitch = uint64_t(s.row_stride) * 2;
  if (rows < 1 || rows >= INT_MAX || pitch % 16 || reinterpret_cast<uintptr_t>(s.data) % 16) return false;
  const EncodeTiled encode = encoder();
  if (encode == nullptr) return false;
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(dim), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {pitch};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUresult r = encode(&map, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            2, const_cast<void*>(s.data), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  static_assert(sizeof(map) == sizeof(out), "CUtensorMap is 128 bytes");
  std::memcpy(out, &map, sizeof(map));
  return true;
}

// Sums the per-row-tile partial scores of long queries, in a fixed order.
__global__ void sum_partials_kernel(const float* partial, float* scores, int m_tiles, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int m = 0; m < m_tiles; ++m) s += partial[int64_t(m) * n + i];
  scores[i] = s;
}

// Per padded document with a mask (and no lengths): one past its last masked-in token, 0 if none.
// The forward takes these as lengths, so that it skips the padding a mask leaves after each
// document (attention masks with skiplist holes) instead of reading it; holes stay the mask's.
// One warp per document, from the end: 32 mask bytes per step until one is set.
__global__ void mask_extent_kernel(const bool* mask, int count, int pad_len, int* extent) {
  const int doc = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (doc >= count) return;
  const bool* m = mask + int64_t(doc) * pad_len;
  int end = 0;
  for (int base = (pad_len - 1) / 32 * 32; base >= 0; base -= 32) {
    const int t = base + lane;
    const unsigned hit = __ballot_sync(0xffffffffu, t < pad_len && m[t]);
    if (hit != 0) {
      end = base + 32 - __clz(hit);
      break;
    }
  }
  if (lane == 0) extent[doc] = end;
}

using namespace fwd_detail;

// Rows (query tokens) and columns (document tokens) of a tensor-core tile.
struct TileDims {
  int rows = 0, cols = 0;
};
TileDims tile_dims(Tile t) {
  TileDims d;
  if (warp_stream(t)) return {32, 32};
  with_tile(t, [&](auto tag) {
    d = {TileShape<decltype(tag)::value, Plain>::BM, TileShape<decltype(tag)::value, Plain>::BN};
  });
  return d;
}

// 16-byte copies: the data and every row start on 16 bytes (`per16` elements).
bool aligned16(const TokenSet& s, int per16 = 8) {
  return reinterpret_cast<uintptr_t>(s.data) % 16 == 0 && s.row_stride % per16 == 0 &&
         s.seg_stride % per16 == 0;
}

int query_rows(const FwdParams& p) { return p.q.offsets ? p.max_lq : p.q.pad_len; }

int num_items(const FwdParams& p) {
  switch (p.pairs.layout) {
    case kAllPairs: return p.d.count;
    case kGrouped: return p.pairs.group;
    default: return p.pairs.num_pairs;
  }
}

// Calls f with the tag of the document storage that p.codes names (fp32 rows: how their TF32
// products are taken, p.tf32).
template <typename F>
auto with_storage(const FwdParams& p, DType dtype, F&& f) {
  if (dtype == DType::kF32) return p.tf32 ? f(RoundTf32{}) : f(SplitTf32{});
  switch (p.codes) {
    case Codes::kInt8: return f(Int8Codes{});
    case Codes::kE4m3: return f(E4m3Codes{});
    case Codes::kInt8x8: return f(Int8x8{});
    default: return f(Plain{});
  }
}

// fp32 rows on the 16-bit wgmma tile run as their fp16 parts (fwd_split_fp16.cu).
bool takes_fp16_parts(Tile tile, DType dtype) { return dtype == DType::kF32 && tile == Tile::kWgmmaBlock; }

// Calls f(storage tag, params, dtype) for the instance that runs `tile` on these inputs: fp32 rows
// on the 16-bit wgmma tile as 16-bit rows of their fp16 parts (as_fp16_parts), else with_storage's
// tag with the inputs as they are.
template <typename F>
auto with_tile_storage(Tile tile, const FwdParams& p, DType dtype, F&& f) {
  if (takes_fp16_parts(tile, dtype)) {
    const FwdParams h = as_fp16_parts(p);
    return p.tf32 ? f(RoundFp16{}, h, DType::kF16) : f(SplitFp16{}, h, DType::kF16);
  }
  return with_storage(p, dtype, [&](auto s) { return f(s, p, dtype); });
}

int resident(Tile tile, const FwdParams& p, DType dtype) {
  return with_tile_storage(tile, p, dtype, [&](auto s, const FwdParams& h, DType t) {
    return storage_resident<decltype(s)>(tile, h, t);
  });
}

size_t tile_smem(Tile tile, const FwdParams& p, DType dtype) {
  return with_tile_storage(tile, p, dtype, [&](auto s, const FwdParams& h, DType t) {
    return storage_smem<decltype(s)>(tile, h, t);
  });
}

// The tile that fits the device's shared memory per block: the 128-row tile takes 108 KB at
// D = 128, more than sm_86 / sm_89 give a block (99 KB), so there a tile steps down to the next
// smaller one, and past the smallest to the CUDA-core kernel.
Tile fitting_tile(Tile tile, const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  while (tile != Tile::kSimt && tile_smem(tile, p, dtype) > size_t(dev.max_smem)) {
    switch (tile) {
      case Tile::kMmaBlock: tile = Tile::kMmaSplit; break;
      case Tile::kMmaSplit: tile = Tile::kMmaStream; break;
      default: tile = Tile::kSimt; break;
    }
  }
  return tile;
}

bool fits(Tile tile, const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  return tile_smem(tile, p, dtype) <= size_t(dev.max_smem);
}

// Documents whose codes the kernel turns into 16-bit operands; everything else (int8 x int8 rows
// included: fp16 pairs of codes) is laid out as 16-bit rows.
bool byte_rows(const FwdParams& p) { return p.codes == Codes::kInt8 || p.codes == Codes::kE4m3; }

// Multiply-adds of a call (query rows x document rows x dim over its pairs), for the fp32 rule.
double multiply_adds(const FwdParams& p) {
  const double doc_rows = double(p.d.rows) / std::max(1, p.d.count);  // per document, on average
  return double(p.pairs.num_pairs) * std::max(1, query_rows(p)) * doc_rows * p.dim;
}

// fp32 calls below this many multiply-adds stay on the CUDA cores: both kernels are then bound by
// their start, and the CUDA-core blocks start sooner.
constexpr double kFp32TensorCoreMacs = double(1 << 24);

// Split-TF32 sums of more dims than this drift past the fp32 contract (1e-6 relative; 1.6e-6
// measured at 256 dims), so exact fp32 calls of wider rows stay on the CUDA cores.
constexpr int kSplitTf32MaxDim = 128;

// Whether the tensor cores take the call: sm_80+, 16-byte rows of at most 256 dims (codes: whole
// 16-byte copies of 16 dims; fp32: four, and at most kSplitTf32MaxDim for the split products).
bool tensor_cores_take(const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  if (dtype == DType::kF32)
    return dev.sm >= 80 && p.dim % 4 == 0 && p.dim <= (p.tf32 ? 256 : kSplitTf32MaxDim) &&
           aligned16(p.q, 4) && aligned16(p.d, 4);
  const bool bytes = byte_rows(p);
  return dev.sm >= 80 && p.dim % (bytes ? 16 : 8) == 0 && p.dim <= 256 && aligned16(p.q) &&
         aligned16(p.d, bytes ? 16 : 8);
}

// The mma.sync tile by query rows (lq), and how many short queries share its rows.
Tile row_tile(const FwdParams& p, int lq, int& qpb) {
  qpb = 1;
  // Several short padded queries of an all-pairs batch fill one 128-row tile.
  if (p.pairs.layout == kAllPairs && p.q.offsets == nullptr && p.dim <= 128 && lq <= 64 &&
      int64_t(p.q.count) * lq >= 128) {
    qpb = 128 / lq;
    return Tile::kMmaBlock;
  }
  if (lq > 64 && p.dim <= 128) return Tile::kMmaBlock;  // long queries: the compute-bound tile
  if (lq > 32) return Tile::kMmaSplit;                  // 33..64 rows (or long ones of D > 128)
  return Tile::kMmaStream;                              // one short query streaming documents
}

// fp32 calls whose fp16 parts take at most this much scratch (a copy of the inputs' size, half in
// the TF32 mode) run on the 16-bit wgmma tile; larger ones split their values in the tile
// (kWgmmaConverted).
constexpr size_t kFp16PartsMaxBytes = size_t(2) << 30;

// Hopper's form of an mma.sync tile, where its shared memory fits.
Tile hopper_tile(Tile tile, const FwdParams& p, const FwdGrid& grid, DType dtype, const DeviceInfo& dev) {
  if (dev.sm != 90) return tile;
  const bool bytes = byte_rows(p);
  const bool fp32 = dtype == DType::kF32;
  // fp32 rows go as fp16 parts (three products at the fp16 rate, one for opt-in TF32) where
  // their scratch is small enough, else as split (or rounded) TF32 on the transposed tile.
  const bool fp16_parts = fp32 && split_fp16_floats(p) * sizeof(float) <= kFp16PartsMaxBytes;
  // fp32 rows: only the block tile goes to wgmma; TF32 operands scores only (kArgmaxInstanceOf).
  if (fp32 && (tile != Tile::kMmaBlock || (p.argmax != nullptr && !fp16_parts))) return tile;
  if (tile == Tile::kMmaBlock) {
    // wgmma needs whole swizzle atoms (64 16-bit dims, 32 fp32; at most two and four) and a
    // query tile that stays (not explicit pairs), and enough document tiles (>= ~32 per SM) to
    // keep the blocks streaming.
    const Tile wg = bytes || (fp32 && !fp16_parts) ? Tile::kWgmmaConverted : Tile::kWgmmaBlock;
    if ((p.dim != 64 && p.dim != 128) || p.pairs.layout == kPairs || !fits(wg, p, dtype, dev)) return tile;
    const int64_t doc_rows = p.pairs.layout == kAllPairs ? p.d.rows : p.d.rows / std::max(1, p.q.count);
    return int64_t(grid.q_tiles) * (doc_rows / 128 + 1) >= int64_t(dev.num_sms) * 32 ? wg : tile;
  }
  if (tile != Tile::kMmaStream) return tile;
  // Padded documents of 512+ tokens: a deeper queue (16-bit) or 16 KB tiles of codes pay there.
  const bool long_padded = p.d.offsets == nullptr && p.d.pad_len >= 512;
  Tile t = tile;
  // 16-bit documents of whole 64-dim atoms: the transposed wgmma reads the query from shared
  // memory once per tile instead of re-loading it by ldmatrix.
  if (p.codes == Codes::kNone && (p.dim == 64 || p.dim == 128)) t = long_padded ? Tile::kWgmmaDeepStream : Tile::kWgmmaStream;
  else if (bytes && p.dim <= 128 && long_padded) t = Tile::kMmaCodeStream;
  return fits(t, p, dtype, dev) ? t : tile;
}

// 8-bit codes of ColBERT / ColPali dims against one short query on Hopper, scores only: warps
// of their own over 32-token tiles beat the block tiles (explicit pairs and argmax keep those).
bool warp_stream_takes(const FwdParams& p, Tile tile, int lq, DType dtype, const DeviceInfo& dev) {
  return !block_tile(tile) && byte_rows(p) && dev.sm == 90 && p.dim == 128 && lq <= 32 &&
         p.pairs.layout != kPairs && p.argmax == nullptr && fits(Tile::kWarpStream, p, dtype, dev);
}

// Documents of 512+ stored rows on average (ColPali pages) whose lengths may differ take blocks
// of four warps: twice the blocks, each with half the documents, so that ragged lengths leave a
// shorter tail. Documents all pad_len long keep the eight-warp blocks, which end together.
Tile warp_stream_tile(const FwdParams& p) {
  const bool long_docs = stored_rows(p.d) >= int64_t(512) * std::max(1, p.d.count);
  const bool ragged = p.d.offsets != nullptr || p.d.lengths != nullptr || p.d.mask != nullptr;
  return long_docs && ragged ? Tile::kWarpStreamFine : Tile::kWarpStream;
}

// DRAM that gives each SM 30+ GB/s (H200; H100: 25): streaming blocks there wait on their loads'
// latency and their starts rather than on bandwidth.
bool fast_dram(const DeviceInfo& dev) { return int64_t(dev.dram_gbps) >= 30 * int64_t(dev.num_sms); }

// Documents per block and the block count, for a plan whose tile and row tiles are chosen.
void size_grid(Plan& plan, const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  FwdGrid& g = plan.grid;
  const int items = std::max(1, num_items(p));
  const int64_t units = int64_t(g.q_tiles) * items;
  if (warp_stream(plan.tile)) {
    // One wave of blocks of up to 32 documents (its document table is a lane per document).
    const int64_t slots = int64_t(dev.num_sms) * resident(plan.tile, p, dtype);
    g.docs_per_block = static_cast<int>(std::min<int64_t>(32, (units + slots - 1) / slots));
  } else if (!block_tile(plan.tile) && g.m_tiles == 1) {
    // Streaming short queries (memory-bound): under two waves of resident blocks, one wave (a
    // block's pipeline runs on from one document into the next); past that, one document per
    // block (a new block's loads overlap the one before's epilogue), more past ~8 waves.
    // 8-bit documents always run one wave: a block's fixed cost is large next to their bytes.
    // The transposed tile of short 16-bit documents runs one wave up to four: its blocks are a
    // few tiles long, so a new block's start costs more than the pipeline running on. Up to eight
    // where the DRAM gives each SM 30+ GB/s (H200; H100: 25): blocks that wait on their loads'
    // latency rather than on bandwidth gain more by running on than by the block scheduler's
    // balancing of one-document blocks.
    const int64_t slots = int64_t(dev.num_sms) * resident(plan.tile, p, dtype);
    const int stream_waves = fast_dram(dev) ? 8 : 4;
    const int64_t one_wave_below = (plan.tile == Tile::kWgmmaStream ? stream_waves : 2) * slots;
    const bool one_wave = p.codes != Codes::kNone || units < one_wave_below;
    const int64_t per_block = one_wave ? (units + slots - 1) / slots : units / (8 * slots);
    g.docs_per_block = static_cast<int>(std::max<int64_t>(1, per_block));
  } else {
    // Compute-bound: about eight blocks per SM, so the tail is short and every SM streams; the
    // wgmma tiles go to 16 where each block still gets 16+ documents.
    const int64_t target = int64_t(dev.num_sms) * 8;
    int64_t chunks = std::max<int64_t>(1, target / std::max(1, g.q_tiles));
    if (plan.tile == Tile::kWgmmaBlock || plan.tile == Tile::kWgmmaConverted)
      chunks = std::max(chunks, std::min<int64_t>(2 * chunks, items / 16));
    g.docs_per_block = static_cast<int>((items + chunks - 1) / chunks);
  }
  const int64_t n_chunks = (items + g.docs_per_block - 1) / g.docs_per_block;
  plan.blocks = static_cast<int>(n_chunks * g.q_tiles);
}

Plan make_plan(const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  Plan plan;
  if (!tensor_cores_take(p, dtype, dev)) return plan;
  // fp32: split TF32 (or TF32 where asked) past a tiny call, which stays on the CUDA cores.
  if (dtype == DType::kF32 && multiply_adds(p) < kFp32TensorCoreMacs) return plan;
  const int lq = std::max(1, query_rows(p));
  plan.tile = fitting_tile(row_tile(p, lq, plan.grid.qpb), p, dtype, dev);
  if (plan.tile == Tile::kSimt) return Plan{};
  if (plan.tile != Tile::kMmaBlock) plan.grid.qpb = 1;  // several queries per tile: 128 rows only
  const int bm = tile_dims(plan.tile).rows;
  plan.grid.m_tiles = plan.grid.qpb > 1 ? 1 : (lq + bm - 1) / bm;
  switch (p.pairs.layout) {  // row tiles: query groups x row slices (explicit pairs: slices only)
    case kAllPairs:
      plan.grid.q_tiles = (p.q.count + plan.grid.qpb - 1) / plan.grid.qpb * plan.grid.m_tiles;
      break;
    case kGrouped: plan.grid.q_tiles = p.q.count * plan.grid.m_tiles; break;
    default: plan.grid.q_tiles = plan.grid.m_tiles; break;
  }
  plan.tile = hopper_tile(plan.tile, p, plan.grid, dtype, dev);
  if (warp_stream_takes(p, plan.tile, lq, dtype, dev)) plan.tile = warp_stream_tile(p);
  size_grid(plan, p, dtype, dev);
  return plan;
}

// Whether all pairs of these inputs take fwd_simt_tile_kernel (padded fp32, Lq <= 128, dims a
// multiple of 4 up to 128 in 16-byte aligned document rows, its shared memory within the limit).
bool simt_tile_fits(const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  return dtype == DType::kF32 && p.pairs.layout == kAllPairs && p.q.offsets == nullptr &&
         p.d.offsets == nullptr && p.q.pad_len >= 1 && p.q.pad_len <= kTileRows && p.dim > 0 &&
         p.dim % 4 == 0 && p.dim <= kTileMaxDim && reinterpret_cast<uintptr_t>(p.d.data) % 16 == 0 &&
         p.d.row_stride % 4 == 0 && p.d.seg_stride % 4 == 0 &&
         simt_tile_smem(p.dim) + 2 * kTileRows * sizeof(float) <= size_t(dev.max_smem);
}

template <bool kArgmax>
void launch_simt(const FwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream) {
  if (simt_tile_fits(p, dtype, dev)) {
    // Row tiles of whole queries x chunks of documents: about four waves of two blocks per SM.
    const int qpb = kTileRows / p.q.pad_len;
    const int64_t q_tiles = (p.q.count + qpb - 1) / qpb;
    const int64_t want = std::max<int64_t>(1, int64_t(dev.num_sms) * 8 / q_tiles);
    const int per_block = static_cast<int>((p.d.count + want - 1) / want);
    const int chunks = (p.d.count + per_block - 1) / per_block;
    const size_t smem = simt_tile_smem(p.dim);
    allow_smem<fwd_simt_tile_kernel<kArgmax>>(smem);
    fwd_simt_tile_kernel<kArgmax><<<static_cast<unsigned>(q_tiles * chunks), kTileThreads, smem,
                                     stream>>>(p, chunks, per_block);
    return;
  }
  const int blocks = static_cast<int>(std::min<int64_t>(p.pairs.num_pairs, int64_t(dev.num_sms) * 32));
  auto go = [&](auto tag) {
    using T = decltype(tag);
    fwd_simt_kernel<T, kArgmax><<<std::max(blocks, 1), kSimtThreads, 0, stream>>>(p);
  };
  switch (dtype) {
    case DType::kF16: go(__half{}); break;
    case DType::kBF16: go(__nv_bfloat16{}); break;
    default: go(float{}); break;
  }
}

}  // namespace

FwdPlan plan_fwd(const FwdParams& p, DType dtype, const DeviceInfo& dev) {
  FwdPlan plan = make_plan(p, dtype, dev);
  if (plan.grid.m_tiles > 1)
    plan.workspace_floats = size_t(plan.grid.m_tiles) * p.pairs.num_pairs;
  // Padded documents described by a mask alone: their extents first, where a tile could be skipped.
  if (plan.tile != Tile::kSimt && p.d.mask != nullptr && p.d.lengths == nullptr &&
      p.d.offsets == nullptr && p.d.pad_len > tile_dims(plan.tile).cols && p.d.count > 0) {
    plan.extents_at = static_cast<int64_t>(plan.workspace_floats);
    plan.workspace_floats += size_t(p.d.count);
  }
  if (takes_fp16_parts(plan.tile, dtype)) {
    plan.parts_at = static_cast<int64_t>((plan.workspace_floats + 31) / 32 * 32);
    plan.workspace_floats = size_t(plan.parts_at) + split_fp16_floats(p);
  }
  return plan;
}

size_t plan_smem(const FwdParams& p, const FwdPlan& plan, DType dtype) {
  return plan.tile == Tile::kSimt ? 0 : tile_smem(plan.tile, p, dtype);
}

void launch_fwd(const FwdParams& p, const FwdPlan& plan, DType dtype, const DeviceInfo& dev,
                cudaStream_t stream) {
  if (p.pairs.num_pairs == 0) return;
  const bool argmax = p.argmax != nullptr;
  if (plan.tile == Tile::kSimt) {  // never with codes: the binding refuses that plan
    if (argmax) launch_simt<true>(p, dtype, dev, stream);
    else launch_simt<false>(p, dtype, dev, stream);
  } else {
    // The wgmma tile loads its 16-bit document tiles by TMA where it can.
    FwdParams tc = p;
    if (plan.extents_at >= 0) {
      int* extent = reinterpret_cast<int*>(p.partial + plan.extents_at);
      const int threads = 256, blocks = static_cast<int>((int64_t(p.d.count) * 32 + threads - 1) / threads);
      mask_extent_kernel<<<blocks, threads, 0, stream>>>(p.d.mask, p.d.count, p.d.pad_len, extent);
      tc.d.lengths = extent;
    }
    if (takes_fp16_parts(plan.tile, dtype)) tc = split_fp16_inputs(tc, p.partial + plan.parts_at, stream);
    with_tile_storage(plan.tile, p, dtype, [&](auto s, const FwdParams&, DType t) {
      using DT = decltype(s);
      if (plan.tile == Tile::kWgmmaBlock) tc.d_tma = encode_rows(tc.d, tc.dim, t, TileShape<Tile::kWgmmaBlock, DT>::BN, tc.d_tmap);
      // The stream tiles take a padded document's first tile and a padded query's rows by TMA
      // (StageLoader::start): a cheaper block start. The deep-stream tile's blocks are long, so
      // that pays only where block starts set the pace (fast DRAM); explicit pairs reload their
      // queries as they go. No document map where a padded document cannot fill the first tile
      // (the kernel copies those): each map is host work on every call.
      if (plan.tile == Tile::kWgmmaStream || (plan.tile == Tile::kWgmmaDeepStream && fast_dram(dev))) {
        const TileDims box = tile_dims(plan.tile);
        tc.d_tma = p.d.offsets == nullptr && p.d.pad_len >= box.cols &&
                   encode_rows(tc.d, tc.dim, t, box.cols, tc.d_tmap);
        tc.q_tma = p.q.offsets == nullptr && p.pairs.layout != kPairs && plan.grid.qpb == 1 &&
                   encode_rows(tc.q, tc.dim, t, box.rows, tc.q_tmap);
      }
      storage_launch<DT>(tc, plan, t, stream);
    });
  }
  if (plan.grid.m_tiles > 1) {
    const int n = p.pairs.num_pairs;
    sum_partials_kernel<<<(n + 255) / 256, 256, 0, stream>>>(p.partial, p.scores, plan.grid.m_tiles, n);
  }
}

}  // namespace maxsim
