// Kernels that test the harness itself (tests/test_metal_harness.py): SIMD collectives in a
// threadgroup of two simdgroups, then deliberately broken kernels that it must catch.
#include "maxsim_common.h"

// Per thread of a 64-thread group: its simdgroup's sum and max, the value of lane 31 - lane, and
// the group's total through threadgroup memory.
template <typename T>
kernel void collectives(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                        constant long& unused [[buffer(2)]],
                        uint3 group_id [[threadgroup_position_in_grid]],
                        uint t [[thread_index_in_threadgroup]]) {
  MS_THREADGROUP_ARRAY(float, sums, 2);
  const uint lane = t % 32;
  const float v = x[t];
  const float sum = simd_sum(v), largest = simd_max(v);
  const float mirrored = simd_shuffle(v, ushort(31 - lane));
  if (lane == 0) sums[t / 32] = sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t * 4] = sum;
  y[t * 4 + 1] = largest;
  y[t * 4 + 2] = mirrored;
  y[t * 4 + 3] = sums[0] + sums[1];
}

// Reads one element past the end of its input.
template <typename T>
kernel void read_past_end(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                          constant long& n [[buffer(2)]],
                          uint3 group_id [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_threadgroup]]) {
  for (long i = lane; i < n; i += 32) y[i] = x[i + 1];
}

// Reverses 32 values through threadgroup memory; with_barrier = 0 leaves out the barrier between
// the writes and the reads, 2 puts one there that orders no memory (mem_none).
template <typename T>
kernel void reverse_through_threadgroup(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                                        constant long& with_barrier [[buffer(2)]],
                                        uint3 group_id [[threadgroup_position_in_grid]],
                                        uint lane [[thread_index_in_threadgroup]]) {
  MS_THREADGROUP_ARRAY(T, staged, 32);
  staged[lane] = x[group_id.x * 32 + lane];
  if (with_barrier == 1) threadgroup_barrier(mem_flags::mem_threadgroup);
  if (with_barrier == 2) threadgroup_barrier(mem_flags::mem_none);  // orders no threadgroup memory
  y[group_id.x * 32 + lane] = staged[31 - lane];
}

// Half of the lanes take a barrier the other half never reach.
template <typename T>
kernel void divergent_barrier(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                              constant long& unused [[buffer(2)]],
                              uint3 group_id [[threadgroup_position_in_grid]],
                              uint lane [[thread_index_in_threadgroup]]) {
  if (lane < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
  y[lane] = x[lane];
}

// A simdgroup_matrix load by half of the lanes (simdgroup operations need all 32).
template <typename T>
kernel void partial_simdgroup_load(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                                   constant long& unused [[buffer(2)]],
                                   uint3 group_id [[threadgroup_position_in_grid]],
                                   uint lane [[thread_index_in_threadgroup]]) {
  simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  if (lane < 16) simdgroup_load(m, x, 8);
  simdgroup_store(m, y, 8);
}

// 40 KB of threadgroup memory (Apple GPUs have 32 KB).
template <typename T>
kernel void too_much_threadgroup_memory(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                                        constant long& unused [[buffer(2)]],
                                        uint3 group_id [[threadgroup_position_in_grid]],
                                        uint lane [[thread_index_in_threadgroup]]) {
  MS_THREADGROUP_ARRAY(float, big, 10240);
  big[lane] = x[lane];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[lane] = big[31 - lane];
}

MS_KERNEL_INSTANCE(collectives_float, collectives, float)
MS_KERNEL_INSTANCE(read_past_end_float, read_past_end, float)
MS_KERNEL_INSTANCE(reverse_through_threadgroup_float, reverse_through_threadgroup, float)
MS_KERNEL_INSTANCE(divergent_barrier_float, divergent_barrier, float)
MS_KERNEL_INSTANCE(partial_simdgroup_load_float, partial_simdgroup_load, float)
MS_KERNEL_INSTANCE(too_much_threadgroup_memory_float, too_much_threadgroup_memory, float)
