// The Hub build's Metal binding: one op, launch(kernel, args, threads, group_size), that encodes a
// kernel of the embedded metallib on the current MPS stream's compute encoder. Which kernel runs, with which
// arguments and grid, is decided in maxsim/metal.py: the same plan that drives
// torch.mps.compile_shader in pip installs and the CPU harness in tests.
#include <ATen/mps/MPSStream.h>
#include <torch/torch.h>

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef EMBEDDED_METALLIB_HEADER
#include EMBEDDED_METALLIB_HEADER
#else
#error "EMBEDDED_METALLIB_HEADER not defined"
#endif

namespace {

id<MTLBuffer> storage_buffer(const at::Tensor& t) {
  return __builtin_bit_cast(id<MTLBuffer>, t.storage().data());
}

// The host names of the shaders' kernel instances (MS_KERNEL_INSTANCE in metal/*.metal); the same
// list as KERNELS in maxsim/metal.py (a test compares the three).
const char* const kKernelNames[] = {
    "maxsim_fwd_float",         "maxsim_fwd_half",         "maxsim_fwd_bfloat",
    "maxsim_gather_rows_float", "maxsim_gather_rows_half", "maxsim_gather_rows_bfloat",
};

// Pipeline states of every kernel, all built at the first launch: a kernel missing from the
// metallib fails that launch (and so the first-use self-test), never a later one.
id<MTLComputePipelineState> pipeline(id<MTLDevice> device, const std::string& name) {
  static std::mutex mutex;
  static std::unordered_map<std::string, id<MTLComputePipelineState>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.empty()) {
    NSError* error = nil;
    id<MTLLibrary> library = EMBEDDED_METALLIB_NAMESPACE::createLibrary(device, &error);
    TORCH_CHECK(library, "maxsim: loading the metallib failed: ",
                error.localizedDescription.UTF8String);
    std::unordered_map<std::string, id<MTLComputePipelineState>> states;
    for (const char* kernel : kKernelNames) {
      id<MTLFunction> fn = [library newFunctionWithName:[NSString stringWithUTF8String:kernel]];
      TORCH_CHECK(fn, "maxsim: the metallib has no kernel named ", kernel);
      id<MTLComputePipelineState> state = [device newComputePipelineStateWithFunction:fn
                                                                                error:&error];
      TORCH_CHECK(state, "maxsim: ", kernel, ": ", error.localizedDescription.UTF8String);
      states.emplace(kernel, state);
    }
    cache.swap(states);
  }
  auto hit = cache.find(name);
  TORCH_CHECK(hit != cache.end(), "maxsim: no kernel named ", name);
  return hit->second;
}

MTLSize size_of(at::IntArrayRef dims) {
  TORCH_CHECK(dims.size() >= 1 && dims.size() <= 3, "maxsim: grids have 1 to 3 dims");
  return MTLSizeMake(dims[0], dims.size() > 1 ? dims[1] : 1, dims.size() > 2 ? dims[2] : 1);
}

}  // namespace

// args[i] binds to [[buffer(i)]]: an MPS tensor by its storage and offset, a CPU tensor (a
// Python int or float of the caller) by value. The kernel is encoded on the current MPS stream's
// compute encoder, on the stream's own serial queue, as PyTorch's MPS ops encode theirs: the
// encoder, its command buffer and their commit belong to PyTorch (ending or committing them here
// would break the ops encoded around this one).
void metal_launch(const std::string& kernel, const std::vector<at::Tensor>& args,
                  at::IntArrayRef threads, at::IntArrayRef group_size) {
  @autoreleasepool {
    at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
    TORCH_CHECK(stream != nullptr, "maxsim: no current MPS stream");
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    id<MTLComputePipelineState> state = pipeline(device, kernel);
    MTLSize grid = size_of(threads), group = size_of(group_size);
    TORCH_CHECK(group.width * group.height * group.depth <= state.maxTotalThreadsPerThreadgroup,
                "maxsim: ", kernel, ": threadgroup larger than the pipeline allows");
    dispatch_sync(stream->queue(), ^() {
      id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
      [encoder setComputePipelineState:state];
      for (NSUInteger i = 0; i < args.size(); ++i) {
        const at::Tensor& t = args[i];
        if (t.device().is_cpu()) {
          [encoder setBytes:t.data_ptr() length:t.nbytes() atIndex:i];
        } else {
          [encoder setBuffer:storage_buffer(t)
                      offset:t.storage_offset() * t.element_size()
                     atIndex:i];
        }
      }
      [encoder dispatchThreads:grid threadsPerThreadgroup:group];
    });
  }
}
