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

# CPU benchmark (compiled kernels, PyTorch path, naive einsum, maxsim-cpu): bench_results/cpu-<model>.json
bench-cpu *args:
    {{python}} benchmarks/bench_cpu.py {{args}}

# Run one example by number: just example 01
example n:
    {{python}} examples/{{n}}_*.py

# kernels-hub variant for the running torch under build/ (arguments: --archs, --out)
build *args:
    {{python}} scripts/build_variant.py {{args}}

# Rewrite the README tables from bench_results/
render:
    {{python}} benchmarks/render.py

# The quickstart, on a fresh machine
demo:
    bash scripts/demo.sh

# What maxsim will run on this machine
info:
    {{python}} -m maxsim.info
