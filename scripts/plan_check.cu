// Host-only check of the forward planner, for GPUs this machine does not have: every plan's tile
// must fit the device's shared memory per block, and the tiles measured fastest on the H100 must
// be the ones picked there. Links the planner's translation units; needs no GPU (the occupancy
// queries fail and the planner falls back to one resident block).
//
//   nvcc -std=c++17 -I csrc scripts/plan_check.cu csrc/fwd.cu csrc/fwd_codes_int8.cu \
//        csrc/fwd_codes_e4m3.cu csrc/fwd_int8x8.cu csrc/fwd_tf32_split.cu csrc/fwd_tf32_round.cu \
//        csrc/fwd_split_fp16.cu -gencode=arch=compute_80,code=compute_80 -o build/plan_check
#include <cstdio>
#include "launch.h"

using namespace maxsim;

namespace {

const char* tile_name(Tile t) {
  switch (t) {
    case Tile::kSimt: return "simt";
    case Tile::kMmaStream: return "mma_stream";
    case Tile::kMmaSplit: return "mma_split";
    case Tile::kMmaBlock: return "mma_block";
    case Tile::kWgmmaBlock: return "wgmma_block";
    case Tile::kWgmmaConverted: return "wgmma_converted";
    case Tile::kWgmmaStream: return "wgmma_stream";
    case Tile::kWgmmaDeepStream: return "wgmma_deep";
    case Tile::kMmaCodeStream: return "mma_codes";
    case Tile::kWarpStream: return "warp_stream";
    case Tile::kWarpStreamFine: return "warp_stream_fine";
  }
  return "?";
}

// Tiles that run only on Hopper (wgmma, or planned there only).
bool hopper_only(Tile t) {
  return t == Tile::kWgmmaBlock || t == Tile::kWgmmaConverted || t == Tile::kWgmmaStream ||
         t == Tile::kWgmmaDeepStream || t == Tile::kMmaCodeStream || warp_stream(t);
}

struct Case {
  const char* name;
  Layout layout;
  int nq, lq, nd, ld, dim;
  Codes codes;
};

alignas(16) unsigned short g_tokens[16];  // a 16-byte aligned address; never read

FwdParams params(const Case& c) {
  FwdParams p{};
  auto set = [](TokenSet& s, int count, int len, int dim) {
    s.data = g_tokens;
    s.count = count;
    s.pad_len = len;
    s.row_stride = dim;
    s.seg_stride = int64_t(len) * dim;
    s.rows = int64_t(count) * len;
  };
  set(p.q, c.nq, c.lq, c.dim);
  set(p.d, c.nd, c.ld, c.dim);
  p.pairs.layout = c.layout;
  p.pairs.group = c.layout == kGrouped ? c.nd / c.nq : 0;
  p.pairs.num_pairs = c.layout == kGrouped ? c.nd : c.nq * c.nd;
  p.dim = c.dim;
  p.max_lq = c.lq;
  p.codes = c.codes;
  return p;
}

}  // namespace

int main() {
  const Case cases[] = {
      {"allpairs_large", kAllPairs, 128, 128, 128, 1024, 128, Codes::kNone},
      {"train_small", kAllPairs, 32, 32, 32, 80, 128, Codes::kNone},
      {"rerank_colpali", kGrouped, 8, 32, 800, 1024, 128, Codes::kNone},
      {"rerank_heavy", kGrouped, 32, 32, 3200, 256, 128, Codes::kNone},
      {"long_queries", kGrouped, 4, 200, 280, 1024, 128, Codes::kNone},
      {"dim256_short", kGrouped, 8, 32, 800, 1024, 256, Codes::kNone},
      {"dim256_long", kAllPairs, 3, 300, 5, 70, 256, Codes::kNone},
      {"dim64_colpali", kGrouped, 8, 32, 800, 1024, 64, Codes::kNone},
      {"int8_colpali", kGrouped, 8, 32, 800, 1024, 128, Codes::kInt8},
      {"int8_dim256", kGrouped, 8, 48, 800, 1024, 256, Codes::kInt8},
      {"int8_corpus", kAllPairs, 16, 32, 10000, 1024, 128, Codes::kInt8},
      {"fp8_corpus", kAllPairs, 16, 32, 10000, 1024, 128, Codes::kE4m3},
      {"int8_heavy", kGrouped, 32, 32, 3200, 256, 128, Codes::kInt8},
      {"int8_dim64", kGrouped, 8, 32, 800, 1024, 64, Codes::kInt8},
      {"fp32_allpairs", kAllPairs, 128, 32, 256, 180, 128, Codes::kNone},
      {"fp32_rerank", kGrouped, 32, 32, 1600, 180, 128, Codes::kNone},
      {"tiny", kAllPairs, 1, 32, 8, 32, 128, Codes::kNone},
  };
  // The emulated GPUs' limits (maxsim/emulation.py: T4, A100, A10G, L4, B200, RTX 5090) and the
  // H100 SXM's (peak DRAM 2619 MHz x 5120 bits, double data rate): opt-in shared memory per block
  // sm_75 64 KB, sm_80 163 KB, sm_86 / sm_89 / sm_120 99 KB, sm_90 / sm_100 227 KB.
  const DeviceInfo t4 = {75, 40, 65536, 320}, a10g = {86, 80, 101376, 600};
  const DeviceInfo h100 = {90, 132, 232448, 3352};
  const DeviceInfo devices[] = {t4,   {80, 108, 166912, 2039}, a10g, {89, 58, 101376, 300},
                                h100, {100, 148, 232448, 8000}, {120, 170, 101376, 1792}};
  int failures = 0;
  auto expect = [&](bool ok, const char* what, const DeviceInfo& dev, const Case& c, Tile t) {
    if (ok) return;
    std::printf("FAIL sm_%d %s: %s (tile %s)\n", dev.sm, c.name, what, tile_name(t));
    ++failures;
  };
  for (const DeviceInfo& dev : devices) {
    for (const Case& c : cases) {
      FwdParams p = params(c);
      for (int mode = 0; mode < 4; ++mode) {  // fp16, bf16, fp32 (split TF32), fp32 (TF32)
        const DType dt = mode == 0 ? DType::kF16 : mode == 1 ? DType::kBF16 : DType::kF32;
        if (dt == DType::kF32 && c.codes != Codes::kNone) continue;
        p.tf32 = mode == 3;
        const FwdPlan plan = plan_fwd(p, dt, dev);
        const size_t smem = plan_smem(p, plan, dt);
        expect(smem <= size_t(dev.max_smem), "tile exceeds the shared memory per block", dev, c, plan.tile);
        expect(plan.tile == Tile::kSimt || plan.blocks > 0, "no blocks", dev, c, plan.tile);
        // below sm_80 no tensor-core tile exists: Python widens 8-bit documents before the call
        expect(c.codes == Codes::kNone || plan.tile != Tile::kSimt || dev.sm < 80,
               "8-bit documents without a tile", dev, c, plan.tile);
        expect(dev.sm >= 80 || plan.tile == Tile::kSimt, "a tensor-core tile below sm_80", dev, c, plan.tile);
        if (dev.sm != 90) expect(!hopper_only(plan.tile), "Hopper-only tile", dev, c, plan.tile);
        // Only the block tiles pack several queries (TileBlock::kOneQuery).
        expect(plan.grid.qpb == 1 || block_tile(plan.tile), "several queries on a one-query tile", dev, c, plan.tile);
        if (mode == 0 || mode == 2)
          std::printf("sm_%d %-15s %s -> %-12s %6zu B smem, %d blocks\n", dev.sm, c.name,
                      mode == 0 ? "fp16" : "fp32", tile_name(plan.tile), smem, plan.blocks);
      }
    }
  }
  // What the H100 measurements chose (docs/ARCHITECTURE.md).
  const struct { int at; Tile tile; } want[] = {
      {0, Tile::kWgmmaBlock}, {1, Tile::kMmaBlock}, {2, Tile::kWgmmaDeepStream},
      {3, Tile::kWgmmaStream}, {8, Tile::kWarpStream}, {10, Tile::kWgmmaConverted},
      {11, Tile::kWgmmaConverted}, {12, Tile::kWarpStream}, {13, Tile::kMmaCodeStream}};
  for (const auto& w : want) {
    const FwdPlan plan = plan_fwd(params(cases[w.at]), DType::kF16, h100);
    expect(plan.tile == w.tile, "not the tile measured fastest on the H100", h100, cases[w.at], plan.tile);
  }
  // Long 8-bit documents of given lengths (ragged) take the four-warp blocks, full ones the eight.
  FwdParams ragged = params(cases[8]);
  ragged.d.lengths = reinterpret_cast<const int*>(g_tokens);  // planning never reads it
  const FwdPlan fine = plan_fwd(ragged, DType::kF16, h100);
  expect(fine.tile == Tile::kWarpStreamFine, "ragged long 8-bit documents: not four-warp blocks", h100,
         cases[8], fine.tile);
  // Short 16-bit documents between four and eight waves of streaming blocks (without a GPU
  // every tile counts as one resident block per SM): one document per block on the H100, one
  // wave of several per block where the DRAM gives each SM 30+ GB/s (the H200: 3201 MHz x
  // 6016 bits).
  const DeviceInfo h200 = {90, 132, 232448, 4814};
  const Case waves6 = {"rerank_k25_ld256", kGrouped, 32, 32, 800, 256, 128, Codes::kNone};
  const FwdPlan on_h100 = plan_fwd(params(waves6), DType::kF16, h100);
  const FwdPlan on_h200 = plan_fwd(params(waves6), DType::kF16, h200);
  expect(on_h100.tile == Tile::kWgmmaStream && on_h100.grid.docs_per_block == 1,
         "past four waves: not one document per block", h100, waves6, on_h100.tile);
  expect(on_h200.tile == Tile::kWgmmaStream && on_h200.grid.docs_per_block > 1,
         "below eight waves: not one wave of several documents per block", h200, waves6, on_h200.tile);
  // fp32: the compute-bound and streaming TF32 tiles on every GPU where they fit (exact all pairs
  // on Hopper: the 16-bit wgmma tile on the rows' fp16 parts); tiny calls on the CUDA cores.
  const struct { int at; Tile h100, sm86; } fp32[] = {
      {14, Tile::kWgmmaBlock, Tile::kMmaStream}, {15, Tile::kMmaStream, Tile::kMmaStream}, {16, Tile::kSimt, Tile::kSimt}};
  for (const auto& w : fp32) {
    const Tile on_h100 = plan_fwd(params(cases[w.at]), DType::kF32, h100).tile;
    const Tile on_sm86 = plan_fwd(params(cases[w.at]), DType::kF32, a10g).tile;
    expect(on_h100 == w.h100, "fp32: not the planned tile", h100, cases[w.at], on_h100);
    expect(on_sm86 == w.sm86, "fp32: not the planned tile", a10g, cases[w.at], on_sm86);
  }
  // Opt-in TF32 all pairs on Hopper: one product of the fp16 parts on the same tile.
  FwdParams rounded = params(cases[14]);
  rounded.tf32 = true;
  const FwdPlan rounded_plan = plan_fwd(rounded, DType::kF32, h100);
  expect(rounded_plan.tile == Tile::kWgmmaBlock && rounded_plan.parts_at >= 0,
         "fp32 TF32: not the fp16 parts' tile", h100, cases[14], rounded_plan.tile);
  const FwdPlan exact_plan = plan_fwd(params(cases[14]), DType::kF32, h100);
  expect(exact_plan.parts_at >= 0 && exact_plan.parts_at % 32 == 0, "fp32 parts: no aligned scratch", h100,
         cases[14], exact_plan.tile);
  // A corpus whose fp16 parts would take more than 2 GiB of scratch keeps split (or rounded)
  // TF32 on the transposed tile. The TF32 mode's parts (hi halves alone) take half the scratch:
  // 1.8 GB at this corpus, which therefore stays on the parts' tile in that mode, and twice the
  // corpus is past it.
  const Case big = {"fp32_big_corpus", kAllPairs, 4, 32, 40000, 180, 128, Codes::kNone};
  const Case bigger = {"fp32_bigger_corpus", kAllPairs, 4, 32, 80000, 180, 128, Codes::kNone};
  FwdParams big_params = params(big), bigger_params = params(bigger);
  bigger_params.tf32 = true;
  const FwdPlan exact_big = plan_fwd(big_params, DType::kF32, h100);
  const FwdPlan tf32_bigger = plan_fwd(bigger_params, DType::kF32, h100);
  expect(exact_big.tile == Tile::kWgmmaConverted && exact_big.parts_at < 0,
         "fp32 past the parts' scratch: not split TF32 on the transposed tile", h100, big, exact_big.tile);
  expect(tf32_bigger.tile == Tile::kWgmmaConverted && tf32_bigger.parts_at < 0,
         "fp32 TF32 past the parts' scratch: not TF32 on the transposed tile", h100, bigger, tf32_bigger.tile);
  big_params.tf32 = true;
  const FwdPlan tf32_big = plan_fwd(big_params, DType::kF32, h100);
  expect(tf32_big.tile == Tile::kWgmmaBlock && tf32_big.parts_at >= 0,
         "fp32 TF32 with the hi halves' scratch in bounds: not the parts' tile", h100, big, tf32_big.tile);
  big_params.tf32 = false;
  // fp32 all pairs with the argmax: fp16 parts on the 16-bit wgmma tile (both modes); past the
  // parts' scratch the mma.sync block tile, since kWgmmaConverted has no fp32 argmax instance
  // (kArgmaxInstanceOf; a plan without an instance launches nothing).
  alignas(16) static int g_argmax[1];
  FwdParams with_argmax = params(cases[14]);
  with_argmax.argmax = g_argmax;
  big_params.argmax = bigger_params.argmax = g_argmax;
  for (const bool tf32 : {false, true}) {
    with_argmax.tf32 = tf32;
    const Tile argmax_tile = plan_fwd(with_argmax, DType::kF32, h100).tile;
    expect(argmax_tile == Tile::kWgmmaBlock, "fp32 with argmax: not the 16-bit wgmma tile", h100, cases[14], argmax_tile);
    const Tile big_argmax = plan_fwd(tf32 ? bigger_params : big_params, DType::kF32, h100).tile;
    expect(big_argmax == Tile::kMmaBlock, "fp32 with argmax past the parts' scratch: not mma.sync", h100,
           tf32 ? bigger : big, big_argmax);
  }
  // Exact fp32 rows wider than the split products keep (dim256_short): the CUDA cores; single
  // TF32 takes the tensor cores there.
  FwdParams wide = params(cases[5]);
  const Tile exact_wide = plan_fwd(wide, DType::kF32, h100).tile;
  expect(exact_wide == Tile::kSimt, "fp32 exact over 256 dims: not the CUDA cores", h100, cases[5], exact_wide);
  wide.tf32 = true;
  const Tile tf32_wide = plan_fwd(wide, DType::kF32, h100).tile;
  expect(tf32_wide != Tile::kSimt, "fp32 TF32 over 256 dims: not the tensor cores", h100, cases[5], tf32_wide);
  std::printf("plan check: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
