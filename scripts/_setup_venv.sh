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
