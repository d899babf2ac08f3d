#!/usr/bin/env bash
# Set up everything `run` and its tests need, on a fresh machine: a virtual environment in .venv
# with the CPU build of torch, this package (editable) with all its extras, and its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned: an unpinned `torch` may pull a multi-GB CUDA build
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  pip install "torch==$TORCH_VERSION"
fi
# this package was called `runner` on the index before (a name taken there): drop such an install of this
# checkout, whose top-level `recipes` package would shadow a user's own
if .venv/bin/python -m pip show runner 2>/dev/null | grep -qx "Editable project location: $PWD"; then
  pip uninstall -y runner
fi
# the extras too (fairscale, examples: the default job's digits data, plots), and the test tools
pip install -e ".[all,test]"
echo "ready: .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
