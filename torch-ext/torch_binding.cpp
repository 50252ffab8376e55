// Registers the ops every entry point of the package is built on (schemas first, then the CUDA
// implementations, then the autograd formulas). Shapes and semantics: docs/ARCHITECTURE.md.
#if defined(METAL_KERNEL)
// The Metal build registers one op, which launches a kernel of its metallib (metal/maxsim_metal.mm);
// maxsim/metal.py plans every launch and registers the ops' MPS kernels on top of it.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "registration.h"

void metal_launch(const std::string& kernel, const std::vector<at::Tensor>& args,
                  at::IntArrayRef threads, at::IntArrayRef group_size);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, m) {
  m.def("launch(str kernel, Tensor[] args, int[] threads, int[] group_size) -> ()");
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, MPS, m) { m.impl("launch", &metal_launch); }

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
#else
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#if !defined(CPU_KERNEL)  // a CPU-only build (kernel-builder's cpu backend, or the CPU JIT build)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>
#include <tuple>

#include "autograd.h"
#include "cpu/ops.h"
#include "maxsim/schemas.h"
#include "registration.h"
#if !defined(CPU_KERNEL)
#include "emulated_gpus.h"
#include "launch.h"
#endif

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

#if !defined(CPU_KERNEL)  // the CUDA implementations

maxsim::DType dtype_of(const Tensor& x) {
  switch (x.scalar_type()) {
    case at::kHalf: return maxsim::DType::kF16;
    case at::kBFloat16: return maxsim::DType::kBF16;
    case at::kFloat: return maxsim::DType::kF32;
    default: TORCH_CHECK(false, "maxsim: expected float32, float16 or bfloat16, got ", x.scalar_type());
  }
}

// int32 copies of a call's int64 index tensors, alive until its launches are queued (the
// allocator reuses their memory in stream order after that), filled by one launch (flush) once
// the call's params are complete.
struct IndexCopies {
  std::vector<Tensor> keep;
  maxsim::Int32Copies pending;
  void flush() {
    if (pending.count == 0) return;
    maxsim::launch_saturate_int32(pending, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pending = {};
  }
  int* add(const Tensor& wide) {
    if (pending.count == maxsim::Int32Copies::kMax) flush();
    Tensor narrow = at::empty(wide.sizes(), wide.options().dtype(at::kInt));
    const int i = pending.count++;
    pending.in[i] = wide.data_ptr<int64_t>();
    pending.out[i] = narrow.data_ptr<int>();
    pending.n[i] = wide.numel();
    keep.push_back(narrow);
    return pending.out[i];
  }
};

// Optional index / mask tensors: right dtype, on the device, contiguous. int64 index values are
// read as an int32 copy, saturated at the int32 range (IndexCopies; index32.cu).
const int* int_ptr(const OptTensor& t, const char* name, const Tensor& like, IndexCopies& copies) {
  if (!t.has_value()) return nullptr;
  const bool wide = t->scalar_type() == at::kLong;
  TORCH_CHECK(wide || t->scalar_type() == at::kInt, "maxsim: ", name, " must be int32 or int64, got ", t->scalar_type());
  TORCH_CHECK(t->device() == like.device(), "maxsim: ", name, " must be on ", like.device());
  TORCH_CHECK(t->is_contiguous(), "maxsim: ", name, " must be contiguous");
  return wide ? copies.add(*t) : t->data_ptr<int>();
}
const bool* mask_ptr(const OptTensor& t, const char* name, const Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kBool, "maxsim: ", name, " must be bool, got ", t->scalar_type());
  TORCH_CHECK(t->device() == like.device(), "maxsim: ", name, " must be on ", like.device());
  TORCH_CHECK(t->is_contiguous(), "maxsim: ", name, " must be contiguous");
  return t->data_ptr<bool>();
}

maxsim::TokenSet token_set(const Tensor& x, const OptTensor& offsets, const OptTensor& lengths,
                           const OptTensor& mask, const char* name, IndexCopies& copies) {
  TORCH_CHECK(x.is_cuda(), "maxsim: ", name, " must be a CUDA tensor");
  TORCH_CHECK(x.is_contiguous(), "maxsim: ", name, " must be contiguous");
  maxsim::TokenSet s;
  s.data = x.data_ptr();
  const int64_t dim = x.size(-1);
  s.row_stride = dim;
  s.mask = mask_ptr(mask, "mask", x);
  if (x.dim() == 3) {
    TORCH_CHECK(!offsets.has_value(), "maxsim: ", name, " is padded (3-D) but offsets were given");
    s.count = static_cast<int>(x.size(0));
    s.pad_len = static_cast<int>(x.size(1));
    s.seg_stride = x.size(1) * dim;
    s.rows = x.size(0) * x.size(1);
    s.lengths = int_ptr(lengths, "lengths", x, copies);
    // Numbers as strings: the message never goes through an ostream's numeric facet, which has
    // crashed inside a JIT-built extension whose libstdc++ differed from the process's.
    if (s.lengths) TORCH_CHECK(lengths->numel() == s.count, "maxsim: ", name, " lengths must have one entry per segment (", std::to_string(s.count), "), got ", std::to_string(lengths->numel()));
    if (s.mask) TORCH_CHECK(mask->numel() == s.rows, "maxsim: ", name, " mask must have N*L entries");
  } else {
    TORCH_CHECK(x.dim() == 2, "maxsim: ", name, " must be 2-D (packed) or 3-D (padded), got ", x.dim(), "-D");
    TORCH_CHECK(offsets.has_value(), "maxsim: ", name, " is packed (2-D) and needs offsets");
    TORCH_CHECK(!lengths.has_value(), "maxsim: ", name, " is packed; lengths must be None");
    s.offsets = int_ptr(offsets, "offsets", x, copies);
    TORCH_CHECK(offsets->numel() >= 1, "maxsim: ", name, " offsets must have at least one entry");
    s.count = static_cast<int>(offsets->numel() - 1);
    s.rows = x.size(0);
    if (s.mask) TORCH_CHECK(mask->numel() == s.rows, "maxsim: ", name, " mask must have one entry per row");
  }
  return s;
}

maxsim::PairMap pair_map(int64_t layout, int64_t group, const maxsim::TokenSet& q,
                         const maxsim::TokenSet& d, const OptTensor& pair_q, const OptTensor& pair_d,
                         const Tensor& like, std::vector<int64_t>& shape, IndexCopies& copies) {
  maxsim::PairMap m;
  m.layout = static_cast<maxsim::Layout>(layout);
  int64_t n = 0;
  switch (layout) {
    case maxsim::kAllPairs:
      shape = {q.count, d.count};
      n = int64_t(q.count) * d.count;
      break;
    case maxsim::kGrouped:
      TORCH_CHECK(group >= 0 && int64_t(q.count) * group == d.count,
                  "maxsim: grouped layout needs documents == queries * group");
      m.group = static_cast<int>(group);
      shape = {q.count, group};
      n = d.count;
      break;
    case maxsim::kPairs:
      TORCH_CHECK(pair_q.has_value() && pair_d.has_value(), "maxsim: pairs layout needs pair_q and pair_d");
      TORCH_CHECK(pair_q->numel() == pair_d->numel(), "maxsim: pair_q and pair_d differ in length");
      m.pair_q = int_ptr(pair_q, "pair_q", like, copies);
      m.pair_d = int_ptr(pair_d, "pair_d", like, copies);
      n = pair_q->numel();
      shape = {n};
      break;
    default: TORCH_CHECK(false, "maxsim: unknown layout ", std::to_string(layout));
  }
  TORCH_CHECK(n < (int64_t(1) << 31), "maxsim: too many scores for one call (", n, ")");
  m.num_pairs = static_cast<int>(n);
  return m;
}

// Peak DRAM bandwidth of a device in GB/s (double data rate: 2 x memory clock x bus width),
// looked up once per device; 0 where the driver does not tell.
int dram_gbps(int device) {
  constexpr int kMaxDevices = 64;
  static int known[kMaxDevices] = {};  // GB/s + 1, so that 0 means "not looked up yet"
  if (device >= 0 && device < kMaxDevices && known[device] > 0) return known[device] - 1;
  int khz = 0, bits = 0;
  int gbps = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
    gbps = static_cast<int>(2.0 * khz * 1e3 * bits / 8 / 1e9);
  else
    (void)cudaGetLastError();  // an attribute the driver lacks is not an error of the next launch
  if (device >= 0 && device < kMaxDevices) known[device] = gbps + 1;
  return gbps;
}

maxsim::DeviceInfo device_info() {
  if (const maxsim::DeviceInfo* emulated = maxsim::emulated_limits()) return *emulated;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return {prop->major * 10 + prop->minor, prop->multiProcessorCount,
          static_cast<int>(prop->sharedMemPerBlockOptin), dram_gbps(at::cuda::current_device())};
}

void check_pair(const Tensor& q, const Tensor& d) {
  TORCH_CHECK(q.scalar_type() == d.scalar_type(), "maxsim: queries and documents differ in dtype");
  TORCH_CHECK(q.device() == d.device(), "maxsim: queries and documents are on different devices");
  TORCH_CHECK(q.size(-1) == d.size(-1), "maxsim: queries and documents differ in embedding dim");
}

// Plans and launches the forward of `p`, its outputs (scores, argmax) already in place.
void launch_planned(maxsim::FwdParams& p, const Tensor& like, maxsim::DType dt) {
  const maxsim::DeviceInfo dev = device_info();
  const maxsim::FwdPlan plan = maxsim::plan_fwd(p, dt, dev);
  if (p.codes != maxsim::Codes::kNone)
    TORCH_CHECK(plan.tile != maxsim::Tile::kSimt,
                "maxsim: 8-bit documents need an sm_80+ GPU, an embedding dim that is a multiple "
                "of 16 (at most 256) and 16-byte aligned rows");
  Tensor partial;
  if (plan.workspace_floats > 0) {
    partial = at::empty({static_cast<int64_t>(plan.workspace_floats)}, like.options().dtype(at::kFloat));
    p.partial = partial.data_ptr<float>();
  }
  maxsim::launch_fwd(p, plan, dt, dev, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Scores (and argmax) of `p` with its token sets, pair map, dim and max_lq already filled in.
std::tuple<Tensor, Tensor> run_fwd(maxsim::FwdParams& p, const Tensor& q, maxsim::DType dt,
                                   const std::vector<int64_t>& shape, int64_t max_lq,
                                   bool with_argmax) {
  Tensor scores = at::empty(shape, q.options().dtype(at::kFloat));
  Tensor argmax;
  if (with_argmax) {
    auto ashape = shape;
    ashape.push_back(max_lq);
    argmax = at::empty(ashape, q.options().dtype(at::kInt));
    p.argmax = argmax.data_ptr<int>();
  } else {
    argmax = at::empty({0}, q.options().dtype(at::kInt));
  }
  p.scores = scores.data_ptr<float>();
  launch_planned(p, q, dt);
  return {scores, argmax};
}

void fill_fwd(maxsim::FwdParams& p, const Tensor& q, const Tensor& d, const OptTensor& q_offsets,
              const OptTensor& q_lengths, const OptTensor& q_mask, const OptTensor& d_offsets,
              const OptTensor& d_lengths, const OptTensor& d_mask, const OptTensor& pair_q,
              const OptTensor& pair_d, int64_t layout, int64_t group, int64_t max_lq,
              std::vector<int64_t>& shape, IndexCopies& copies) {
  p.q = token_set(q, q_offsets, q_lengths, q_mask, "queries", copies);
  p.d = token_set(d, d_offsets, d_lengths, d_mask, "documents", copies);
  p.pairs = pair_map(layout, group, p.q, p.d, pair_q, pair_d, q, shape, copies);
  copies.flush();
  p.dim = static_cast<int>(q.size(-1));
  if (q.dim() == 3) TORCH_CHECK(max_lq == q.size(1), "maxsim: max_lq must equal the padded query length");
  TORCH_CHECK(max_lq >= 0, "maxsim: max_lq must be >= 0");
  p.max_lq = static_cast<int>(max_lq);
}

std::tuple<Tensor, Tensor> fwd(const Tensor& q_in, const Tensor& d_in, const OptTensor& q_offsets,
                               const OptTensor& q_lengths, const OptTensor& q_mask,
                               const OptTensor& d_offsets, const OptTensor& d_lengths,
                               const OptTensor& d_mask, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group,
                               int64_t max_lq, bool with_argmax, bool tf32) {
  check_pair(q_in, d_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const Tensor q = q_in.contiguous(), d = d_in.contiguous();
  maxsim::FwdParams p;
  std::vector<int64_t> shape;
  IndexCopies copies;
  fill_fwd(p, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, pair_q, pair_d,
           layout, group, max_lq, shape, copies);
  p.tf32 = tf32;  // fp32 rows: one TF32 product instead of the split three
  return run_fwd(p, q, dtype_of(q), shape, max_lq, with_argmax);
}

// One fp32 scale per token row of `x` (all dims but the last), on its device.
const float* scale_ptr(const OptTensor& scale, const Tensor& x, const char* name) {
  if (!scale.has_value()) return nullptr;
  TORCH_CHECK(scale->scalar_type() == at::kFloat, "maxsim: ", name, " must be float32, got ", scale->scalar_type());
  TORCH_CHECK(scale->device() == x.device(), "maxsim: ", name, " must be on ", x.device());
  TORCH_CHECK(scale->is_contiguous(), "maxsim: ", name, " must be contiguous");
  TORCH_CHECK(scale->numel() * x.size(-1) == x.numel(), "maxsim: ", name, " must have one entry per token");
  return scale->data_ptr<float>();
}

// Inference on scaled tokens: documents as int8 / float8_e4m3fn codes with d_scale (or in the
// queries' dtype without it), queries fp16 / bf16 with an optional per-row q_scale, or int8 codes
// with q_scale against int8 documents (integer tensor cores). Scores are
// sum_i q_scale_i * max_j d_scale_j * <q_i, d_j>, accumulated in fp32 (int32 for int8 x int8).
std::tuple<Tensor, Tensor> fwd_scaled(const Tensor& q_in, const OptTensor& q_scale, const Tensor& d_in,
                                      const OptTensor& d_scale, const OptTensor& q_offsets,
                                      const OptTensor& q_lengths, const OptTensor& q_mask,
                                      const OptTensor& d_offsets, const OptTensor& d_lengths,
                                      const OptTensor& d_mask, const OptTensor& pair_q,
                                      const OptTensor& pair_d, int64_t layout, int64_t group,
                                      int64_t max_lq, bool with_argmax) {
  const bool int8x8 = q_in.scalar_type() == at::kChar;
  TORCH_CHECK(q_in.device() == d_in.device(), "maxsim: queries and documents are on different devices");
  TORCH_CHECK(q_in.size(-1) == d_in.size(-1), "maxsim: queries and documents differ in embedding dim");
  maxsim::Codes codes = maxsim::Codes::kNone;
  if (int8x8) {
    TORCH_CHECK(d_in.scalar_type() == at::kChar, "maxsim: int8 queries take int8 documents");
    TORCH_CHECK(q_scale.has_value(), "maxsim: int8 queries need q_scale");
    TORCH_CHECK(q_in.size(-1) % 16 == 0, "maxsim: int8 x int8 scoring needs an embedding dim that is a multiple of 16");
    codes = maxsim::Codes::kInt8x8;
  } else if (d_in.scalar_type() == at::kChar) {
    codes = maxsim::Codes::kInt8;
  } else if (d_in.scalar_type() == at::kFloat8_e4m3fn) {
    codes = maxsim::Codes::kE4m3;
  } else {
    TORCH_CHECK(d_in.scalar_type() == q_in.scalar_type(), "maxsim: documents must be int8 or float8_e4m3fn codes, or in the queries' dtype");
  }
  const maxsim::DType dt = int8x8 ? maxsim::DType::kF16 : dtype_of(q_in);
  TORCH_CHECK(dt != maxsim::DType::kF32, "maxsim: scaled scoring takes float16, bfloat16 or int8 queries");
  TORCH_CHECK((codes != maxsim::Codes::kNone) == d_scale.has_value(), "maxsim: d_scale goes with 8-bit documents, and only with them");
  const c10::cuda::CUDAGuard guard(q_in.device());
  Tensor q = q_in.contiguous();
  Tensor d = d_in.contiguous();
  // The kernels copy 16 bytes at a time: a view starting mid-row gets an aligned copy.
  if (reinterpret_cast<uintptr_t>(d.data_ptr()) % 16 != 0) d = d.clone();
  // Int8 x int8: the kernels take each row as fp16 pairs of codes (half as many elements).
  if (int8x8) {
    if (reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 != 0) q = q.clone();
    q = q.view(at::kHalf);
    d = d.view(at::kHalf);
  }
  maxsim::FwdParams p;
  std::vector<int64_t> shape;
  IndexCopies copies;
  fill_fwd(p, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, pair_q, pair_d,
           layout, group, max_lq, shape, copies);
  p.codes = codes;
  p.q_scale = scale_ptr(q_scale, q, "q_scale");
  p.d_scale = scale_ptr(d_scale, d, "d_scale");
  return run_fwd(p, q, dt, shape, max_lq, with_argmax);
}

// Stable order of the pairs by one side, with CSR pointers (all on the device, no sync).
std::tuple<Tensor, Tensor> group_pairs(const Tensor& ids, int64_t count) {
  auto [sorted, order] = at::sort(ids.to(at::kLong), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  Tensor bounds = at::arange(count + 1, ids.options().dtype(at::kLong));
  Tensor ptr = at::searchsorted(sorted, bounds);
  return {order.contiguous(), ptr.contiguous()};
}

// Row targets of `ce` as int64 on the scores' device (None: the diagonal).
Tensor ce_targets(const OptTensor& targets, const Tensor& like, int64_t rows) {
  if (!targets.has_value()) return Tensor();
  Tensor t = targets->scalar_type() == at::kLong && targets->is_contiguous()
                 ? *targets : targets->to(at::kLong).contiguous();
  TORCH_CHECK(t.device() == like.device() && t.numel() == rows,
              "maxsim: ce targets must be [rows] on the scores' device");
  return t;
}

maxsim::CeParams ce_params(float* scores, int64_t rows, int64_t cols, const Tensor& targets,
                           double scale, float* loss, float* grad, float* row_loss) {
  TORCH_CHECK(rows < (int64_t(1) << 31) && cols < (int64_t(1) << 31),
              "maxsim: ce supports < 2^31 rows and columns");
  maxsim::CeParams p;
  p.scores = scores;
  p.targets = targets.defined() ? targets.data_ptr<int64_t>() : nullptr;
  p.rows = static_cast<int>(rows);
  p.cols = static_cast<int>(cols);
  p.scale = static_cast<float>(scale);
  p.loss = loss;
  p.grad = grad;
  p.row_loss = row_loss;
  return p;
}

// The backward's token sets and pair map (its gradient and argmax are the caller's to set).
maxsim::BwdParams bwd_params(const Tensor& q, const Tensor& d, const OptTensor& q_offsets,
                             const OptTensor& d_offsets, const OptTensor& pair_q,
                             const OptTensor& pair_d, int64_t layout, int64_t group,
                             std::vector<int64_t>& shape, IndexCopies& copies) {
  maxsim::BwdParams p;
  p.q = token_set(q, q_offsets, std::nullopt, std::nullopt, "queries", copies);
  p.d = token_set(d, d_offsets, std::nullopt, std::nullopt, "documents", copies);
  p.pairs = pair_map(layout, group, p.q, p.d, pair_q, pair_d, q, shape, copies);
  copies.flush();
  p.dim = static_cast<int>(q.size(-1));
  return p;
}

// The backward's params from its forward's: the same token sets without lengths or mask (the
// argmax entries carry them), so each index tensor is checked and converted once.
maxsim::BwdParams bwd_params_of(const maxsim::FwdParams& f) {
  maxsim::BwdParams p;
  p.q = f.q;
  p.d = f.d;
  p.q.lengths = p.d.lengths = nullptr;
  p.q.mask = p.d.mask = nullptr;
  p.pairs = f.pairs;
  p.dim = f.dim;
  p.max_lq = f.max_lq;
  return p;
}

// The dD sort's int32 scratch (argmax entries, then two per document row), or 0 when dD goes
// another way.
int64_t sort_scratch_ints(const maxsim::BwdParams& p, int64_t entries) {
  return maxsim::bwd_sorts_rows(p) ? entries + 2 * p.d.rows : 0;
}

// Launches the backward of `p` (argmax, max_lq and grad set) into new dq, dd. The gradient of
// the scores is p.grad, or, in the training step, the loss's (`ce`, not yet computed): the
// backward kernels then compute it on their way where they can (maxsim::bwd_fuses_ce), else
// `ce`'s own kernels run first. `scratch`: sort_scratch_ints(p) ints, or null to allocate them.
std::tuple<Tensor, Tensor> run_bwd(maxsim::BwdParams& p, const Tensor& q, const Tensor& d,
                                   int64_t layout, const OptTensor& pair_q,
                                   const OptTensor& pair_d, const maxsim::CeParams* ce,
                                   int* scratch) {
  // The dD kernel indexes a document's (pair, token) entries with 32-bit integers.
  const int64_t entries = int64_t(p.pairs.num_pairs) * p.max_lq;
  TORCH_CHECK(entries < (int64_t(1) << 31), "maxsim: backward supports < 2^31 argmax entries per call");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (ce != nullptr) {
    if (maxsim::bwd_fuses_ce(p, ce->cols)) p.ce = *ce;
    else maxsim::launch_ce(*ce, stream);
    p.grad = ce->grad;
  }
  Tensor by_q, q_ptr, by_d, d_ptr;
  if (layout == maxsim::kPairs) {
    std::tie(by_q, q_ptr) = group_pairs(*pair_q, p.q.count);
    std::tie(by_d, d_ptr) = group_pairs(*pair_d, p.d.count);
    p.by_q = by_q.data_ptr<int64_t>();
    p.q_ptr = q_ptr.data_ptr<int64_t>();
    p.by_d = by_d.data_ptr<int64_t>();
    p.d_ptr = d_ptr.data_ptr<int64_t>();
  }
  // Packed query rows past max_lq hold no argmax, so they are never written: start from zeros.
  Tensor dq = q.dim() == 2 ? at::zeros_like(q) : at::empty_like(q);
  Tensor dd = at::empty_like(d);
  p.dq = dq.data_ptr();
  p.dd = dd.data_ptr();
  Tensor own_scratch;
  if (maxsim::bwd_sorts_rows(p)) {
    if (scratch == nullptr) {
      own_scratch = at::empty({sort_scratch_ints(p, entries)}, q.options().dtype(at::kInt));
      scratch = own_scratch.data_ptr<int>();
    }
    p.dd_sorted = scratch;
    p.dd_start = p.dd_sorted + entries;
    p.dd_count = p.dd_start + p.d.rows;
  }
  maxsim::launch_bwd(p, dtype_of(q), device_info(), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dq, dd};
}

std::tuple<Tensor, Tensor> bwd(const Tensor& grad, const Tensor& q_in, const Tensor& d_in,
                               const Tensor& argmax, const OptTensor& q_offsets,
                               const OptTensor& d_offsets, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group) {
  check_pair(q_in, d_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const Tensor q = q_in.contiguous(), d = d_in.contiguous();
  std::vector<int64_t> shape;
  IndexCopies copies;
  maxsim::BwdParams p = bwd_params(q, d, q_offsets, d_offsets, pair_q, pair_d, layout, group, shape, copies);
  TORCH_CHECK(argmax.scalar_type() == at::kInt && argmax.is_contiguous(), "maxsim: argmax must be contiguous int32");
  TORCH_CHECK(argmax.dim() == static_cast<int64_t>(shape.size()) + 1, "maxsim: argmax has the wrong rank");
  p.max_lq = static_cast<int>(argmax.size(-1));
  if (q.dim() == 3) TORCH_CHECK(p.max_lq == q.size(1), "maxsim: argmax width must equal the padded query length");
  TORCH_CHECK(argmax.numel() == int64_t(p.pairs.num_pairs) * p.max_lq, "maxsim: argmax must be [scores..., max_lq]");
  const Tensor g = grad.to(at::kFloat).contiguous();
  TORCH_CHECK(g.numel() == p.pairs.num_pairs, "maxsim: grad must have one value per score");
  p.grad = g.data_ptr<float>();
  p.argmax = argmax.data_ptr<int>();
  return run_bwd(p, q, d, layout, pair_q, pair_d, nullptr, nullptr);
}

// Softmax cross-entropy of the rows of `scores` and its gradient with respect to them.
std::tuple<Tensor, Tensor> ce(const Tensor& scores_in, const OptTensor& targets, double scale) {
  TORCH_CHECK(scores_in.is_cuda() && scores_in.dim() == 2, "maxsim: ce expects CUDA scores [rows, cols]");
  const c10::cuda::CUDAGuard guard(scores_in.device());
  const Tensor scores = scores_in.to(at::kFloat).contiguous();
  const int64_t rows = scores.size(0);
  const Tensor t = ce_targets(targets, scores, rows);
  Tensor loss = at::empty({}, scores.options()), grad = at::empty_like(scores);
  Tensor row_loss = at::empty({rows}, scores.options());
  const maxsim::CeParams p = ce_params(scores.data_ptr<float>(), rows, scores.size(1), t, scale,
                                       loss.data_ptr<float>(), grad.data_ptr<float>(),
                                       row_loss.data_ptr<float>());
  if (rows == 0) loss.fill_(NAN);  // the mean of no rows, as torch's cross_entropy
  maxsim::launch_ce(p, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {loss, grad};
}

// A whole contrastive training step without autograd: scores with argmax, then the backward,
// which computes the loss and its gradient with respect to the scores on its way (four launches
// where bwd_fuses_ce allows, six otherwise). What the step keeps to itself (scores, argmax, the
// loss's gradient and row losses, the dD sort's scratch) is one allocation: the host work of a
// small step is most of its time.
std::tuple<Tensor, Tensor, Tensor> contrastive_step(
    const Tensor& q_in, const Tensor& d_in, const OptTensor& q_offsets, const OptTensor& q_lengths,
    const OptTensor& q_mask, const OptTensor& d_offsets, const OptTensor& d_lengths,
    const OptTensor& d_mask, int64_t layout, int64_t group, int64_t max_lq,
    const OptTensor& targets, double scale) {
  TORCH_CHECK(layout != maxsim::kPairs, "maxsim: contrastive_step takes all-pairs or grouped scores");
  check_pair(q_in, d_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const Tensor q = q_in.contiguous(), d = d_in.contiguous();
  maxsim::FwdParams fp;
  std::vector<int64_t> shape;
  IndexCopies copies;
  fill_fwd(fp, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, std::nullopt,
           std::nullopt, layout, group, max_lq, shape, copies);
  maxsim::BwdParams bp = bwd_params_of(fp);
  const int64_t rows = shape[0], cols = shape[1], n = rows * cols, entries = n * max_lq;
  const Tensor t = ce_targets(targets, q, rows);
  // [scores n | argmax entries | d loss / d scores n | row losses rows | sort scratch], 4-byte words
  Tensor work = at::empty({2 * n + entries + rows + sort_scratch_ints(bp, entries)},
                          q.options().dtype(at::kFloat));
  float* w = work.data_ptr<float>();
  fp.scores = w;
  fp.argmax = reinterpret_cast<int*>(w + n);
  launch_planned(fp, q, dtype_of(q));
  Tensor loss = at::empty({}, q.options().dtype(at::kFloat));
  if (rows == 0) loss.fill_(NAN);  // the mean of no rows, as torch's cross_entropy
  float* grad = w + n + entries;
  const maxsim::CeParams ce = ce_params(fp.scores, rows, cols, t, scale, loss.data_ptr<float>(),
                                        grad, grad + n);
  bp.argmax = fp.argmax;
  auto [dq, dd] = run_bwd(bp, q, d, layout, std::nullopt, std::nullopt, &ce,
                          reinterpret_cast<int*>(grad + n + rows));
  return {loss, dq, dd};
}

#endif  // !CPU_KERNEL

}  // namespace

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, m) {
  m.def(maxsim::schema::kFwd);
  m.def(maxsim::schema::kBwd);
  m.def(maxsim::schema::kFwdScaled);
  m.def(maxsim::schema::kCe);
  m.def(maxsim::schema::kContrastiveStep);
}

#if !defined(CPU_KERNEL)
TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, m) {
  m.impl("fwd", &fwd);
  m.impl("fwd_scaled", &fwd_scaled);
  m.impl("bwd", &bwd);
  m.impl("ce", &ce);
  m.impl("contrastive_step", &contrastive_step);
}
#endif

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, Autograd, m) {
  m.impl("fwd", &maxsim::autograd::fwd);
  m.impl("ce", &maxsim::autograd::ce);
  m.impl("contrastive_step", &maxsim::autograd::contrastive_step);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
#endif  // METAL_KERNEL
