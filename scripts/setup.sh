#!/usr/bin/env bash
# Set up everything `run` and its tests need, on a fresh machine: a virtual environment in .venv
# with torch (pinned), this package (editable) with all its extras, and its test tools. Idempotent.
# torch comes from pip's own index, as configured (PyPI gives Linux x86_64 its CUDA build, several GB);
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes it from that index instead (the CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"  # for torch only: pip's --index-url (its dependencies come from there too)
PYTHON="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned (then the extras and test tools take the one installed), from TORCH_INDEX_URL when set
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
fi
# this package was called `runner` on the index before (a name taken there): drop such an install of this
# checkout, whose top-level `recipes` package would shadow a user's own
if .venv/bin/python -m pip show runner 2>/dev/null | grep -qx "Editable project location: $PWD"; then
  pip uninstall -y runner
fi
# the extras too (fairscale, examples: the default job's digits data, plots), and the test tools
pip install -e ".[all,test]"
# the checkout's modules compiled once (pip did the installed packages'): where PYTHONDONTWRITEBYTECODE is set, as
# on some machines, every `run` and every Slurm or mpirun task would otherwise compile them again when it starts
.venv/bin/python -m compileall -q -j 0 runner recipes > /dev/null
echo "ready: .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
