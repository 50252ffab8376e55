# The developer's verbs. `just` lists them; `just python=/path/to/python build` picks an interpreter
# (building the extension needs a CUDA build of torch and nvcc).

python := if path_exists(".venv/bin/python") == "true" { ".venv/bin/python" } else { "python3" }

default:
    @just --list

# Test suite (sets up .venv on first use); arguments go to pytest
test *args:
    bash scripts/test.sh {{args}}

# Lint with ruff (settings in pyproject.toml)
lint:
    {{python}} -m pip install --quiet ruff
    {{python}} -m ruff check .

# Benchmarks: writes bench_results/<gpu>.json
bench *args:
    {{python}} benchmarks/bench.py {{args}}

# Benchmarks on Apple Silicon (mps): maxsim's Metal kernels vs naive PyTorch on mps, into
# bench_results/apple-<chip>.json; arguments go to bench.py (e.g. --only rerank,train_small)
bench-metal *args:
    {{python}} benchmarks/bench.py --impl maxsim,maxsim-autograd,naive {{args}}
# CPU benchmark (compiled kernels, PyTorch path, naive einsum, maxsim-cpu): bench_results/cpu-<model>.json
bench-cpu *args:
    {{python}} benchmarks/bench_cpu.py {{args}}

# Run one example by number: just example 01
example n:
    {{python}} examples/{{n}}_*.py

# kernels-hub variant for the running torch under build/ (arguments: --archs, --out)
build *args:
    {{python}} scripts/build_variant.py {{args}}

# Mutation check: deliberate bugs in the fallback and the argument checks, each must fail a test
mutants *args:
    {{python}} scripts/mutants.py {{args}}

# Rewrite the benchmark tables of README.md and docs/BENCHMARKS.md from bench_results/
render:
    {{python}} benchmarks/render.py

# The quickstart, on a fresh machine
demo:
    bash scripts/demo.sh

# What maxsim will run on this machine
info:
    {{python}} -m maxsim.info

# The benchmark on HF Jobs, one GPU flavor (h100, h200, a100-large, ...): --dry-run prints the
# submission only; MAXSIM_RESULTS_REPO names the dataset repository that receives the results
bench-matrix flavor *args:
    {{python}} scripts/hf_job.py submit --flavor {{flavor}} {{args}}

# Every GPU's bench_results/<gpu>.json from the results repository (then `just render`)
bench-pull *args:
    {{python}} scripts/hf_job.py pull {{args}}
