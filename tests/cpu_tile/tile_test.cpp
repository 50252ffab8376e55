// Standalone test of the CPU tile (csrc/cpu/tile.h) on every ISA this CPU runs, against the
// scalar tile and a float64 reference: random shapes (odd h, query counts off the vector width),
// bf16-exact random values and 1/8-grid values (exact sums: exact ties), NaN tokens, empty runs,
// and a run split in two. Built for x86-64 natively and for AArch64 under qemu by
// tests/test_cpu_tile_native.py. Prints the number of compared cases; exits 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/tile.h"

using namespace maxsim::cpu;

namespace {

float to_bf16_exact(float x) {  // round to nearest even, keep as fp32
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &b, 4);
  return x;
}

struct Result {
  std::vector<float> max;
  std::vector<int> arg, nan;
};

// Runs `tile` over queries q [nq][h] and documents d [n][h] (tokens split at `split`).
Result run(const Tile& tile, const std::vector<float>& q, int nq, const std::vector<float>& d,
           int n, int64_t h, int split) {
  const int nv = (nq + tile.lanes - 1) / tile.lanes;
  const int64_t elems = nv * query_vector_elems(h, tile.lanes, tile.pair);
  std::vector<float> qt32(tile.bf16_rows() ? 0 : elems, 0.f);
  std::vector<uint16_t> qt16(tile.bf16_rows() ? elems : 0, 0);
  void* qt = tile.bf16_rows() ? static_cast<void*>(qt16.data()) : static_cast<void*>(qt32.data());
  for (int c = 0; c < nq; ++c) store_query_token(tile, h, c, q.data() + c * h, qt);
  std::vector<uint16_t> d16(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &d[i], 4);
    d16[i] = static_cast<uint16_t>(b >> 16);
  }
  std::vector<const void*> rows(n);
  std::vector<int> tok(n);
  for (int j = 0; j < n; ++j) {
    rows[j] = tile.bf16_rows() ? static_cast<const void*>(d16.data() + j * h)
                               : static_cast<const void*>(d.data() + j * h);
    tok[j] = 3 * j + 1;  // indices with gaps, as a mask leaves them
  }
  Result r{std::vector<float>(nv * tile.lanes, -INFINITY), std::vector<int>(nv * tile.lanes, -1),
           std::vector<int>(nv * tile.lanes, 0)};
  const RowState s{r.max.data(), r.arg.data(), r.nan.data()};
  fold_tokens(tile, qt, h, nv, rows.data(), tok.data(), split, s);
  fold_tokens(tile, qt, h, nv, rows.data() + split, tok.data() + split, n - split, s);
  return r;
}

}  // namespace

int main() {
  std::mt19937 rng(20261206);
  const int64_t hs[] = {1, 2, 3, 7, 16, 17, 31, 33, 64, 96, 127, 128, 129};
  int cases = 0, failures = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t h = hs[trial % 13];
    const int nq = 1 + static_cast<int>(rng() % 37), n = static_cast<int>(rng() % 41);
    const bool grid = trial % 2 == 0;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto value = [&] { return grid ? std::round(u(rng) * 8.f) / 8.f : to_bf16_exact(u(rng)); };
    std::vector<float> q(nq * h), d(n * h);
    for (float& x : q) x = value();
    for (float& x : d) x = value();
    if (n > 3 && trial % 3 == 0) std::memcpy(&d[2 * h], &d[0], h * 4);  // an exact tie
    if (n > 2 && trial % 5 == 0) d[(n / 2) * h + h / 2] = NAN;       // a NaN token
    const int split = n ? static_cast<int>(rng() % (n + 1)) : 0;
    const Result ref = run(tile_for(Isa::kScalar, false), q, nq, d, n, h, n);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kNeon}) {
      if (!cpu_has(isa)) continue;
      for (bool bf16 : {false, true}) {
        const Tile tile = tile_for(isa, bf16);
        const Result got = run(tile, q, nq, d, n, h, split);
        ++cases;
        for (int c = 0; c < nq; ++c) {
          const int i = c, k = c;  // scalar and vector layouts both index states by token
          double exact = -INFINITY, bound = 0;
          for (int j = 0; j < n; ++j) {
            double dot = 0, mag = 0;
            for (int64_t e = 0; e < h; ++e) {
              dot += double(q[c * h + e]) * d[j * h + e];
              mag += std::fabs(double(q[c * h + e]) * d[j * h + e]);
            }
            if (dot > exact) exact = dot;
            bound = std::fmax(bound, mag);
          }
          // fp32 paths: the scalar tile's roundings exactly; the bf16 pairs: the same error bound
          // as any fp32 sum of exact products (h roundings), and exact on the grid.
          const bool same_order = !tile.bf16_rows() || grid;
          bool ok = got.nan[k] != 0 ? ref.nan[i] != 0 : ref.nan[i] == 0;
          if (ref.nan[i] == 0 && n > 0) {
            if (same_order)
              ok = ok && got.max[k] == ref.max[i] && got.arg[k] == ref.arg[i];
            else
              ok = ok && std::fabs(got.max[k] - exact) <= (h + 1) * 0x1p-24 * bound + 1e-30;
          }
          if (n == 0) ok = ok && got.arg[k] == -1 && std::isinf(got.max[k]);
          if (!ok && failures++ < 10)
            std::printf("MISMATCH %s bf16=%d h=%lld nq=%d n=%d token %d: max %.9g vs %.9g "
                        "(float64 %.9g), arg %d vs %d, nan %d vs %d\n",
                        isa_name(tile.isa), int(bf16), (long long)h, nq, n, c, got.max[k],
                        ref.max[i], exact, got.arg[k], ref.arg[i], got.nan[k], ref.nan[i]);
        }
      }
    }
  }
  std::printf("best ISA %s: %d cases compared, %d mismatches\n", isa_name(best_isa()), cases,
              failures);
  return failures ? 1 : 0;
}
