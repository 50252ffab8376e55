// Autograd of the ops, in C++: a call that needs no gradient pays only the dispatcher's check, and
// one that does records a node whose backward runs `bwd` on the saved argmax. Both ops are reached
// through the dispatcher, so fake tensors (torch.compile) take the same path. torch_binding.cpp
// registers these for the Autograd key; STRINGIFY and TORCH_EXTENSION_NAME come from registration.h.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <tuple>

#include "cpu/ops.h"
#include "registration.h"

namespace maxsim::autograd {
// Internal linkage: two builds loaded in one process (a Hub variant beside the JIT build) must
// not share op_of's cached op, which a weak template symbol would make them do.
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// The registered op `name` with the signature `Fn` (every build's ops share cpu/ops.h's
// signatures), looked up once.
template <typename Fn>
const auto& op_of(const char* name) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow((std::string(STRINGIFY(TORCH_EXTENSION_NAME) "::") + name).c_str(), "")
          .typed<Fn>();
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FwdGrad : torch::autograd::Function<FwdGrad> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& d,
                               const OptTensor& q_offsets, const OptTensor& q_lengths,
                               const OptTensor& q_mask, const OptTensor& d_offsets,
                               const OptTensor& d_lengths, const OptTensor& d_mask,
                               const OptTensor& pair_q, const OptTensor& pair_d, int64_t layout,
                               int64_t group, int64_t max_lq, bool with_argmax, bool tf32) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [scores, argmax] =
        op_of<decltype(cpu::fwd)>("fwd").call(q, d, q_offsets, q_lengths, q_mask, d_offsets,
                                              d_lengths, d_mask, pair_q, pair_d, layout, group,
                                              max_lq, with_argmax, tf32);
    ctx->mark_non_differentiable({argmax});
    ctx->set_materialize_grads(false);  // no zero-filled gradient for the argmax output
    ctx->save_for_backward({q, d, argmax, q_offsets.value_or(Tensor()), d_offsets.value_or(Tensor()),
                            pair_q.value_or(Tensor()), pair_d.value_or(Tensor())});
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["group"] = group;
    ctx->saved_data["with_argmax"] = with_argmax;
    return {scores, argmax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(ctx->saved_data["with_argmax"].toBool(),
                "fwd: backward needs the argmax, but fwd ran with with_argmax=False; call it with "
                "with_argmax=True when an input requires grad");
    variable_list out(15);
    if (!grads[0].defined()) return out;  // nothing flowed into the scores
    const auto saved = ctx->get_saved_variables();
    auto opt = [](const Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    auto [dq, dd] = op_of<decltype(cpu::bwd)>("bwd").call(
        grads[0], saved[0], saved[1], saved[2], opt(saved[3]), opt(saved[4]), opt(saved[5]),
        opt(saved[6]), ctx->saved_data["layout"].toInt(), ctx->saved_data["group"].toInt());
    if (ctx->needs_input_grad(0)) out[0] = dq;
    if (ctx->needs_input_grad(1)) out[1] = dd;
    return out;
  }
};

std::tuple<Tensor, Tensor> fwd(const Tensor& q, const Tensor& d, const OptTensor& q_offsets,
                               const OptTensor& q_lengths, const OptTensor& q_mask,
                               const OptTensor& d_offsets, const OptTensor& d_lengths,
                               const OptTensor& d_mask, const OptTensor& pair_q,
                               const OptTensor& pair_d, int64_t layout, int64_t group,
                               int64_t max_lq, bool with_argmax, bool tf32) {
  if (!(at::GradMode::is_enabled() && (q.requires_grad() || d.requires_grad()))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op_of<decltype(cpu::fwd)>("fwd").call(q, d, q_offsets, q_lengths, q_mask, d_offsets,
                                                 d_lengths, d_mask, pair_q, pair_d, layout, group,
                                                 max_lq, with_argmax, tf32);
  }
  auto out = FwdGrad::apply(q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask,
                            pair_q, pair_d, layout, group, max_lq, with_argmax, tf32);
  return {out[0], out[1]};
}

// The loss's gradient with respect to the scores is computed with the loss; backward scales it.
struct CeGrad : torch::autograd::Function<CeGrad> {
  static variable_list forward(AutogradContext* ctx, const Tensor& scores, const OptTensor& targets,
                               double scale) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, grad] = op_of<decltype(cpu::ce)>("ce").call(scores, targets, scale);
    ctx->mark_non_differentiable({grad});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({grad});
    return {loss, grad};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(3);
    if (grads[0].defined()) out[0] = ctx->get_saved_variables()[0] * grads[0];
    return out;
  }
};

std::tuple<Tensor, Tensor> ce(const Tensor& scores, const OptTensor& targets, double scale) {
  if (!(at::GradMode::is_enabled() && scores.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op_of<decltype(cpu::ce)>("ce").call(scores, targets, scale);
  }
  auto out = CeGrad::apply(scores, targets, scale);
  return {out[0], out[1]};
}

// The step returns gradients: its outputs never require grad themselves.
std::tuple<Tensor, Tensor, Tensor> contrastive_step(
    const Tensor& q, const Tensor& d, const OptTensor& q_offsets, const OptTensor& q_lengths,
    const OptTensor& q_mask, const OptTensor& d_offsets, const OptTensor& d_lengths,
    const OptTensor& d_mask, int64_t layout, int64_t group, int64_t max_lq,
    const OptTensor& targets, double scale) {
  at::AutoDispatchBelowADInplaceOrView below;
  return op_of<decltype(cpu::contrastive_step)>("contrastive_step").call(
      q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, layout, group, max_lq,
      targets, scale);
}

}  // namespace
}  // namespace maxsim::autograd
