{
  description = "maxsim: exact MaxSim late-interaction scoring kernels, built for the Hugging Face kernels Hub";

  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
  };

  # build.toml says what to build; kernel-builder builds it for every supported torch x CUDA variant
  # and, on aarch64-darwin, the torch<MAJ><MIN>-metal-aarch64-darwin variants ([kernel.maxsim_metal]).
  # `nix run .#build-and-copy` writes build/<variant>/ (scripts/build_variant.py makes the same
  # layout for the running torch only, without Nix).
  outputs =
    {
      self,
      kernel-builder,
    }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
