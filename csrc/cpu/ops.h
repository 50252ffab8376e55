// The CPU implementations of the package's ops (schemas: torch-ext/torch_binding.cpp; semantics:
// docs/ARCHITECTURE.md). torch-ext/torch_binding_cpu.cpp registers them for CPU tensors.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace maxsim::cpu {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

std::tuple<Tensor, Tensor> fwd(const Tensor& q, const Tensor& d, const OptTensor& q_offsets,
                               const OptTensor& q_lengths, const OptTensor& q_mask,
                               const OptTensor& d_offsets, const OptTensor& d_lengths,
                               const OptTensor& d_mask, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group,
                               int64_t max_lq, bool with_argmax, bool tf32);

std::tuple<Tensor, Tensor> bwd(const Tensor& grad, const Tensor& q, const Tensor& d,
                               const Tensor& argmax, const OptTensor& q_offsets,
                               const OptTensor& d_offsets, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group);

std::tuple<Tensor, Tensor> ce(const Tensor& scores, const OptTensor& targets, double scale);

std::tuple<Tensor, Tensor, Tensor> contrastive_step(
    const Tensor& q, const Tensor& d, const OptTensor& q_offsets, const OptTensor& q_lengths,
    const OptTensor& q_mask, const OptTensor& d_offsets, const OptTensor& d_lengths,
    const OptTensor& d_mask, int64_t layout, int64_t group, int64_t max_lq,
    const OptTensor& targets, double scale);

}  // namespace maxsim::cpu
