// Read-only streaming probes over ragged padded documents [N, Ld, 128] fp16 (lengths uniform in
// [Ld / 2, Ld], as the benchmark's rerank rows): how close to the copy bandwidth does a one-pass
// reader of exactly the valid rows get, by scheduling scheme (a block per document with 2-4
// cp.async stages, one wave of multi-document blocks, forced occupancy, a query copy, per-row bulk
// copies, a persistent grid taking documents from an atomic queue, a persistent grid with equal tile
// shares)? No MMA: the floor under the forward's streaming tiles. Each variant is timed as a CUDA
// graph of 20 launches over rotating copies (every call reads DRAM), median of 9 replays; "floor" is
// the valid bytes at 3.02 TB/s (the H100's measured copy bandwidth).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/stream_probe benchmarks/stream_probe.cu
//   /tmp/stream_probe [shape name or part of one, e.g. int8]
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
constexpr int D = 128, BN = 64, ROWB = D * 2, TILEB = BN * ROWB;  // 16 KB tiles

__device__ __forceinline__ void cp16(void* s, const void* g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

struct Args { const char* d; const int* len; int n, ld; float* out; int* counter; const int* tile_doc; const int* tile_idx; int total_tiles; };

// copy rows [row0, row0+rows) of doc into smem tile: 128 threads, 16 chunks per row
__device__ __forceinline__ void copy_tile(char* dst, const Args& a, int doc, int row0, int rows) {
  const int t = threadIdx.x, c = t % 16, r0 = t / 16;
  const char* src = a.d + ((size_t)doc * a.ld + row0) * ROWB + c * 16;
  for (int r = r0; r < BN; r += 8) if (r < rows) cp16(dst + r * ROWB + c * 16, src + (size_t)r * ROWB);
}
__device__ __forceinline__ float consume(const char* s) {
  __syncthreads();
  float v = __half2float(reinterpret_cast<const __half*>(s)[threadIdx.x * 8]);
  return v;
}

// A: block per doc, STAGES-deep cp.async pipeline over its tiles (ours without the MMA)
template <int STAGES>
__global__ void __launch_bounds__(128) block_per_doc(Args a) {
  extern __shared__ __align__(16) char sm[];
  const int doc = blockIdx.x, len = a.len[doc], tiles = max(1, (len + BN - 1) / BN);
  float acc = 0;
  for (int s = 0; s < STAGES - 1; ++s) { if (s < tiles) copy_tile(sm + s * TILEB, a, doc, s * BN, len - s * BN); commit(); }
  for (int t = 0; t < tiles; ++t) {
    wait<STAGES - 2>();
    __syncthreads();
    int nt = t + STAGES - 1;
    if (nt < tiles) copy_tile(sm + (nt % STAGES) * TILEB, a, doc, nt * BN, len - nt * BN);
    commit();
    acc += consume(sm + (t % STAGES) * TILEB);
  }
  if (threadIdx.x == 0) a.out[doc] = acc;
}

// A': a block per `per_block` consecutive documents (one wave), its pipeline running on from one
// document into the next (the 8-bit forward's grid).
template <int STAGES>
__global__ void __launch_bounds__(128) block_per_chunk(Args a, int per_block) {
  extern __shared__ __align__(16) char sm[];
  const int d0 = blockIdx.x * per_block, d1 = min(a.n, d0 + per_block);
  int total = 0;
  for (int d = d0; d < d1; ++d) total += max(1, (a.len[d] + BN - 1) / BN);
  int pd = d0, pt = 0, plen = a.len[d0];
  auto issue = [&](int slot) {
    if (pd < d1) {
      copy_tile(sm + slot * TILEB, a, pd, pt * BN, plen - pt * BN);
      if (++pt == max(1, (plen + BN - 1) / BN)) { pt = 0; if (++pd < d1) plen = a.len[pd]; }
    }
    commit();
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  float acc = 0;
  for (int t = 0; t < total; ++t) {
    wait<STAGES - 2>();
    __syncthreads();
    issue((t + STAGES - 1) % STAGES);
    acc += consume(sm + (t % STAGES) * TILEB);
  }
  if (acc == 1.2345f) a.out[blockIdx.x] = acc;
}

// B: block per doc, every row of the doc requested at once into registers (max loads in flight)
__global__ void __launch_bounds__(128) block_per_doc_regs(Args a) {
  const int doc = blockIdx.x, len = a.len[doc];
  const int t = threadIdx.x, c = t % 16, r0 = t / 16;
  const uint4* src = reinterpret_cast<const uint4*>(a.d + (size_t)doc * a.ld * ROWB) + c;
  float acc = 0;
  constexpr int U = 8;
  for (int base = r0; base < len; base += 8 * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { int r = base + u * 8; if (r < len) v[u] = __ldcs(src + (size_t)r * 16); else v[u] = make_uint4(0,0,0,0); }
#pragma unroll
    for (int u = 0; u < U; ++u) acc += __uint_as_float(v[u].x & 0x3fffffff);
  }
  if (acc == 1.2345f) a.out[doc] = acc;
}

// C: persistent blocks, dynamic queue of docs (atomic), pipeline continues across docs; the next
// doc index is fetched one doc ahead so the atomic's latency hides.
template <int STAGES>
__global__ void __launch_bounds__(128) persistent_queue(Args a) {
  extern __shared__ __align__(16) char sm[];
  __shared__ int next_s;
  float acc = 0;
  // producer state
  int p_doc = blockIdx.x, p_tile = 0, p_len = p_doc < a.n ? a.len[p_doc] : 0;
  int fetched = -1;  // thread 0: the doc after p_doc
  if (threadIdx.x == 0) fetched = gridDim.x + atomicAdd(a.counter, 1);
  auto p_tiles = [&]() { return max(1, (p_len + BN - 1) / BN); };
  auto issue = [&](int stage) {
    if (p_doc < a.n) {
      copy_tile(sm + stage * TILEB, a, p_doc, p_tile * BN, p_len - p_tile * BN);
      if (++p_tile == p_tiles()) {
        if (threadIdx.x == 0) next_s = fetched;
        __syncthreads();
        p_doc = next_s; p_tile = 0; p_len = p_doc < a.n ? a.len[p_doc] : 0;
        if (threadIdx.x == 0 && p_doc < a.n) fetched = gridDim.x + atomicAdd(a.counter, 1);
      }
    }
    commit();
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  int stage = 0;
  // consumer: run until producer ran out and all stages consumed
  int pending = STAGES - 1;
  while (true) {
    wait<STAGES - 2>();
    __syncthreads();
    bool more = p_doc < a.n;
    issue((stage + STAGES - 1) % STAGES);
    acc += consume(sm + stage * TILEB);
    stage = (stage + 1) % STAGES;
    if (!more) { if (--pending == 0) break; }
  }
  if (acc == 1.2345f) a.out[blockIdx.x] = acc;
  // last block resets the counter
  __syncthreads();
  if (threadIdx.x == 0) { __threadfence(); if (atomicAdd(a.counter + 1, 1) == gridDim.x - 1) { a.counter[0] = 0; a.counter[1] = 0; } }
}

// D: persistent, statically balanced: block b takes tiles [b*T/G, (b+1)*T/G) of the flat tile list
template <int STAGES>
__global__ void __launch_bounds__(128) balanced_tiles(Args a) {
  extern __shared__ __align__(16) char sm[];
  const int G = gridDim.x, b = blockIdx.x;
  const int t0 = (int)((long)b * a.total_tiles / G), t1 = (int)((long)(b + 1) * a.total_tiles / G);
  float acc = 0;
  auto issue = [&](int stage, int t) {
    if (t < t1) { int doc = a.tile_doc[t], ti = a.tile_idx[t]; int len = a.len[doc]; copy_tile(sm + stage * TILEB, a, doc, ti * BN, len - ti * BN); }
    commit();
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s, t0 + s);
  for (int t = t0; t < t1; ++t) {
    wait<STAGES - 2>();
    __syncthreads();
    issue((t - t0 + STAGES - 1) % STAGES, t + STAGES - 1);
    acc += consume(sm + ((t - t0) % STAGES) * TILEB);
  }
  if (acc == 1.2345f) a.out[b] = acc;
}

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(uint64_t* b, int c) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(sa(b)), "r"(c) : "memory"); }
__device__ __forceinline__ void mb_expect(uint64_t* b, uint32_t bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sa(b)), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mb_wait(uint64_t* b, int parity) {
  asm volatile("{\n.reg .pred done;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra W;\n}\n" :: "r"(sa(b)), "r"(parity) : "memory"); }
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" :: "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar)) : "memory"); }

// QM: 0 no query, 1 query (8 KB) by 16-byte cp.async joined to the first tile's group, 2 query by one
// bulk copy. DM: 0 document tiles by 16-byte cp.async, 1 by one bulk copy per row (64 threads).
template <int QM, int DM>
__global__ void __launch_bounds__(128) bpd(Args a, const char* q, int docs_per_q) {
  extern __shared__ __align__(16) char sm[];
  char* q_s = sm;                // 8 KB
  char* d_s = sm + 8192;         // 2 stages
  __shared__ __align__(8) uint64_t bars[3];
  const int doc = blockIdx.x, tid = threadIdx.x;
  const char* qsrc = q + (size_t)(doc / docs_per_q) * 8192;
  if (tid == 0) { mb_init(bars, 1); mb_init(bars + 1, 1); mb_init(bars + 2, 1); asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
  __syncthreads();
  const int len = a.len[doc], tiles = max(1, (len + BN - 1) / BN);
  auto issue = [&](int t) {
    if (t < tiles) {
      const int rows = min(BN, len - t * BN);
      char* dst = d_s + (t % 2) * TILEB;
      if (DM == 0) copy_tile(dst, a, doc, t * BN, rows);
      else {
        if (tid == 0) mb_expect(bars + (t % 2), rows * ROWB);
        if (tid < rows) bulk(dst + tid * ROWB, a.d + ((size_t)doc * a.ld + t * BN + tid) * ROWB, ROWB, bars + (t % 2));
      }
    }
    commit();
  };
  if (QM == 2 && tid == 0) { mb_expect(bars + 2, 8192); bulk(q_s, qsrc, 8192, bars + 2); }
  issue(0);
  if (QM == 1) { for (int c = tid; c < 512; c += 128) cp16(q_s + c * 16, qsrc + c * 16); commit(); }
  float acc = 0;
  for (int t = 0; t < tiles; ++t) {
    if (DM == 0 || (QM == 1 && t == 0)) wait<0>();  // cp.async groups: the tile's, the query's
    if (DM == 1) mb_wait(bars + (t % 2), (t / 2) & 1);
    if (QM == 2 && t == 0) mb_wait(bars + 2, 0);
    __syncthreads();
    issue(t + 1);
    acc += consume(d_s + (t % 2) * TILEB);
    if (QM) acc += __half2float(reinterpret_cast<const __half*>(q_s)[tid]);
  }
  if (acc == 1.2345f) a.out[doc] = acc;
}
__global__ void empty_kernel(Args) {}

template <typename F>
float time_graph(F launch, int reps = 20, int replays = 9) {
  cudaStream_t s; CK(cudaStreamCreate(&s));
  for (int i = 0; i < 3; ++i) launch(s, i);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; ++i) launch(s, i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> v;
  CK(cudaGraphLaunch(ge, s));
  for (int r = 0; r < replays; ++r) {
    cudaEventRecord(e0, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(e1, s); CK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms * 1000.f / reps);
  }
  std::sort(v.begin(), v.end());
  CK(cudaGetLastError());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  // heavy_int8 / colpali_int8: the bytes of the 8-bit rows (rerank_heavy_int8, rerank_colpali_int8:
  // 128-byte rows of Ld 256 / 1024) as 256-byte rows of half the length. An argument keeps the
  // shapes whose name contains it.
  struct Shape { const char* name; int n, ld; } shapes[] = {{"rerank", 1600, 180}, {"rerank_heavy", 3200, 256}, {"rerank_colpali", 800, 1024}, {"ld128", 800, 128}, {"ld256", 800, 256},
                                                            {"heavy_int8", 3200, 128}, {"colpali_int8", 800, 512}};
  float empty_us;
  {
    Args a{}; empty_us = time_graph([&](cudaStream_t s, int) { empty_kernel<<<1, 32, 0, s>>>(a); });
    printf("empty kernel in graph: %.2f us\n", empty_us);
  }
  for (auto sh : shapes) {
    if (argc > 1 && !strstr(sh.name, argv[1])) continue;
    const int copies = 3;
    size_t bytes = (size_t)sh.n * sh.ld * ROWB;
    std::vector<char*> d(copies);
    for (auto& p : d) { CK(cudaMalloc(&p, bytes)); CK(cudaMemset(p, 0x11, bytes)); }
    srand(7);
    std::vector<int> len(sh.n); long valid = 0; std::vector<int> td, ti;
    for (int i = 0; i < sh.n; ++i) { len[i] = sh.ld / 2 + rand() % (sh.ld - sh.ld / 2 + 1); valid += len[i];
      for (int t = 0; t < (len[i] + BN - 1) / BN; ++t) { td.push_back(i); ti.push_back(t); } }
    int *len_d, *ctr, *td_d, *ti_d; float* out;
    CK(cudaMalloc(&len_d, sh.n * 4)); CK(cudaMemcpy(len_d, len.data(), sh.n * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&td_d, td.size() * 4)); CK(cudaMemcpy(td_d, td.data(), td.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&ti_d, ti.size() * 4)); CK(cudaMemcpy(ti_d, ti.data(), ti.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&ctr, 8)); CK(cudaMemset(ctr, 0, 8)); CK(cudaMalloc(&out, 1 << 20));
    double vbytes = (double)valid * ROWB;
    double floor_us = vbytes / 3.02e12 * 1e6;
    auto args = [&](int i) { return Args{d[i % copies], len_d, sh.n, sh.ld, out, ctr, td_d, ti_d, (int)td.size()}; };
    auto report = [&](const char* what, float us) { printf("%-14s %-34s %7.2f us  %.3fx floor (%.2f us, %.1f MB)  eff %.0f GB/s\n", sh.name, what, us, us / floor_us, floor_us, vbytes / 1e6, vbytes / us / 1e3); };
    auto setsmem = [](auto k, int b) { CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, b)); };
    setsmem(block_per_doc<2>, 2 * TILEB); setsmem(block_per_doc<3>, 3 * TILEB); setsmem(block_per_doc<4>, 4 * TILEB);
    setsmem(persistent_queue<2>, 2 * TILEB); setsmem(persistent_queue<3>, 3 * TILEB); setsmem(persistent_queue<4>, 4 * TILEB);
    setsmem(balanced_tiles<2>, 2 * TILEB); setsmem(balanced_tiles<3>, 3 * TILEB); setsmem(balanced_tiles<4>, 4 * TILEB);
    report("block/doc cp.async 2 stages", time_graph([&](cudaStream_t s, int i) { block_per_doc<2><<<sh.n, 128, 2 * TILEB, s>>>(args(i)); }));
    report("block/doc cp.async 3 stages", time_graph([&](cudaStream_t s, int i) { block_per_doc<3><<<sh.n, 128, 3 * TILEB, s>>>(args(i)); }));
    report("block/doc cp.async 4 stages", time_graph([&](cudaStream_t s, int i) { block_per_doc<4><<<sh.n, 128, 4 * TILEB, s>>>(args(i)); }));
    {
      // one wave of multi-document blocks (as the 8-bit forward): two 16 KB stages at five blocks
      // per SM, or three at four
      const int smem5 = (227 * 1024) / 5 - 1024; char buf[64];
      const int per5 = (sh.n + 5 * sms - 1) / (5 * sms), per4 = (sh.n + 4 * sms - 1) / (4 * sms);
      setsmem(block_per_chunk<2>, smem5); setsmem(block_per_chunk<3>, 3 * TILEB);
      snprintf(buf, 64, "one wave, %d docs/block, 5/SM, 2 st", per5);
      report(buf, time_graph([&](cudaStream_t s, int i) { block_per_chunk<2><<<(sh.n + per5 - 1) / per5, 128, smem5, s>>>(args(i), per5); }));
      snprintf(buf, 64, "one wave, %d docs/block, 4/SM, 3 st", per4);
      report(buf, time_graph([&](cudaStream_t s, int i) { block_per_chunk<3><<<(sh.n + per4 - 1) / per4, 128, 3 * TILEB, s>>>(args(i), per4); }));
    }
    for (int occ : {3, 4, 5, 6}) {
      int smem = std::max(2 * TILEB, (227 * 1024) / occ - 1024); char buf[64];
      setsmem(block_per_doc<2>, smem);
      snprintf(buf, 64, "block/doc 2 stages, %d per SM", occ);
      report(buf, time_graph([&](cudaStream_t s, int i) { block_per_doc<2><<<sh.n, 128, smem, s>>>(args(i)); }));
    }
    {
      char* qbuf; CK(cudaMalloc(&qbuf, 32 * 8192)); CK(cudaMemset(qbuf, 0x22, 32 * 8192));
      const int smem5 = (227 * 1024) / 5 - 1024;
      auto kq = [&](auto k, const char* name) {
        setsmem(k, smem5);
        report(name, time_graph([&](cudaStream_t s, int i) { k<<<sh.n, 128, smem5, s>>>(args(i), qbuf, sh.n / 32); }));
      };
      kq(bpd<0, 0>, "5/SM cp.async docs, no query");
      kq(bpd<1, 0>, "5/SM cp.async docs, cp.async query");
      kq(bpd<2, 0>, "5/SM cp.async docs, bulk query");
      kq(bpd<0, 1>, "5/SM bulk-row docs, no query");
      kq(bpd<1, 1>, "5/SM bulk-row docs, cp.async query");
      kq(bpd<2, 1>, "5/SM bulk-row docs, bulk query");
      cudaFree(qbuf);
    }
    report("block/doc all rows in regs", time_graph([&](cudaStream_t s, int i) { block_per_doc_regs<<<sh.n, 128, 0, s>>>(args(i)); }));
    for (int per_sm : {2, 4}) {
      for (int st : {2, 3}) {
        if (st * TILEB * per_sm > 227 * 1024) continue;
        int G = sms * per_sm; char buf[64];
        auto kq = st == 2 ? persistent_queue<2> : st == 3 ? persistent_queue<3> : persistent_queue<4>;
        auto kb = st == 2 ? balanced_tiles<2> : st == 3 ? balanced_tiles<3> : balanced_tiles<4>;
        snprintf(buf, 64, "queue %d/SM %d stages", per_sm, st);
        report(buf, time_graph([&](cudaStream_t s, int i) { kq<<<G, 128, st * TILEB, s>>>(args(i)); }));
        snprintf(buf, 64, "balanced tiles %d/SM %d stages", per_sm, st);
        report(buf, time_graph([&](cudaStream_t s, int i) { kb<<<G, 128, st * TILEB, s>>>(args(i)); }));
      }
    }
    for (auto p : d) cudaFree(p);
    cudaFree(len_d); cudaFree(ctr); cudaFree(td_d); cudaFree(ti_d); cudaFree(out);
  }
  return 0;
}
