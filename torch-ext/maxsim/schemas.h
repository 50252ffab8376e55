// The op schemas, written once: torch_binding.cpp defines the extension's ops with them, and
// maxsim/schemas.py reads this file to define the Python namespaces' ops with the same strings.
// Keep each one a `constexpr char kName[] = "..." "...";` of plain literals: schemas.py parses it.
#pragma once

namespace maxsim::schema {

constexpr char kFwd[] =
    "fwd(Tensor q, Tensor d, Tensor? q_offsets, Tensor? q_lengths, Tensor? q_mask, "
    "Tensor? d_offsets, Tensor? d_lengths, Tensor? d_mask, Tensor? pair_q, Tensor? pair_d, "
    "int layout, int group, int max_lq, bool with_argmax, bool tf32) "
    "-> (Tensor scores, Tensor argmax)";

constexpr char kBwd[] =
    "bwd(Tensor grad, Tensor q, Tensor d, Tensor argmax, Tensor? q_offsets, Tensor? d_offsets, "
    "Tensor? pair_q, Tensor? pair_d, int layout, int group) -> (Tensor dq, Tensor dd)";

// The 8-bit forward (CUDA extension only): fwd's arguments with the two scales, without tf32.
constexpr char kFwdScaled[] =
    "fwd_scaled(Tensor q, Tensor? q_scale, Tensor d, Tensor? d_scale, Tensor? q_offsets, "
    "Tensor? q_lengths, Tensor? q_mask, Tensor? d_offsets, Tensor? d_lengths, Tensor? d_mask, "
    "Tensor? pair_q, Tensor? pair_d, int layout, int group, int max_lq, bool with_argmax) "
    "-> (Tensor scores, Tensor argmax)";

constexpr char kCe[] =
    "ce(Tensor scores, Tensor? targets, float scale) -> (Tensor loss, Tensor grad)";

constexpr char kContrastiveStep[] =
    "contrastive_step(Tensor q, Tensor d, Tensor? q_offsets, Tensor? q_lengths, Tensor? q_mask, "
    "Tensor? d_offsets, Tensor? d_lengths, Tensor? d_mask, int layout, int group, int max_lq, "
    "Tensor? targets, float scale) -> (Tensor loss, Tensor dq, Tensor dd)";

}  // namespace maxsim::schema
