# Sourced by test.sh and demo.sh: makes .venv ready on a fresh machine, then activates it.
# A CPU torch is enough (the package runs its PyTorch fallback); an importable torch is kept.

pip_install() {
  # pip warns about every index location configured but absent on this machine: drop those lines.
  pip install --quiet "$@" 2> >(grep -v "^WARNING: Location '" >&2)
}

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  pip_install torch==2.13.0
fi
# Re-install only when the packaging files change (an editable install sees code edits anyway).
stamp=".venv/.maxsim-install-$(cat pyproject.toml setup.py | sha256sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
  pip_install -e ".[test]"
  rm -f .venv/.maxsim-install-*
  touch "$stamp"
fi
# MAXSIM_TEST_INTEGRATIONS=1 adds the libraries the integrations patch, at the versions the tests
# pin, keeping the torch already installed. PyLate pins sentence-transformers 5, so
# sentence-transformers 6.3 (multi-vector similarity and its hub kernel layers), the transformers
# it needs and `kernels` go to their own folder, .venv/st63, which test.sh puts first on
# PYTHONPATH for the tests of that library and of hub loading (transformers 5.25 and kernels 0.19
# share a process). It also adds the bench extra's wordllama (the fidelity benchmark's token table),
# and late-interaction-kernels in .venv/lik, read only for its Metal shader text.
if [ "${MAXSIM_TEST_INTEGRATIONS:-0}" = 1 ]; then
  istamp=".venv/.maxsim-integrations-pylate1.6.0-colpali0.3.18-st6.3.0-tf5.25.0-kernels0.19.1-tabulate-wordllama0.4.0-lik0.4.5"
  if [ ! -e "$istamp" ]; then
    torch_pin="torch==$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
    # The libraries' own requirements, minus two that would replace torch: PyLate's fast-plaid (its
    # index search, built per torch release) and colpali-engine's torchvision. Neither is imported
    # by the scoring and losses that the integrations patch.
    pip_install -c <(echo "$torch_pin") sentence-transformers==5.3.0 "transformers>=5.3.0,<=5.3.0" \
      "datasets>=2.20.0" "accelerate>=0.31.0" "pandas>=2.2.1" ujson==5.12.0 ninja==1.11.1.4 \
      fastkmeans==0.5.0 "peft>=0.18.0,<0.21.0" "pillow>=10.0.0" wordllama==0.4.0.post1
    pip_install --no-deps pylate==1.6.0 colpali-engine==0.3.18
    rm -rf .venv/st6 .venv/kernels  # an earlier layout's folders
    # --no-deps for the three (a --target install would bring its own torch), then what they need
    # beyond the venv, none of which depends on torch.
    pip_install --no-deps --upgrade --target .venv/st63 sentence-transformers==6.3.0 \
      transformers==5.25.0 kernels==0.19.1
    pip_install --upgrade --target .venv/st63 "huggingface-hub>=2.4.0,<3.0" \
      "tokenizers>=0.23.1,<0.24.0" "safetensors>=0.8.0" "regex>=2025.10.22" typer \
      "tomlkit>=0.13.3" tabulate
    # Metal source known to run on Macs, for the Metal front-end check's positive control.
    pip_install --no-deps --upgrade --target .venv/lik late-interaction-kernels==0.4.5
    rm -f .venv/.maxsim-integrations-*
    touch "$istamp"
  fi
fi
