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
# (the installed version read from its metadata: importing torch takes a second)
torch_version() { .venv/bin/python -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null; }
if [ "$(torch_version | cut -d+ -f1)" != "$TORCH_VERSION" ]; then
  pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
fi
# this package was called `runner` on the index before (a name taken there): drop such an install of this
# checkout, whose top-level `recipes` package would shadow a user's own
if .venv/bin/python -m pip show runner 2>/dev/null | grep -qx "Editable project location: $PWD"; then
  pip uninstall -y runner
fi
# Every module compiled once, here: where PYTHONDONTWRITEBYTECODE is set, as on some machines, every `run` and every
# Slurm or mpirun task would otherwise compile what it imports again when it starts. pip compiles what it installs one
# file at a time (two thirds of torch's install); compileall uses every core, and compiles torch's files (those
# installed so far) while pip installs the rest. A file that does not compile (a package's Python 2 leftovers) is
# skipped, as pip skips it.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
compile() { .venv/bin/python -m compileall -q -j 0 "$@" > /dev/null 2>&1 || true; }
mapfile -t installed < <(find "$site" -mindepth 1 -maxdepth 1 -type d)
compile "${installed[@]}" &
compiling=$!
# the extras too (fairscale, examples: the default job's digits data, plots), and the test tools (MkDocs among them:
# the suite builds the documentation site)
pip install --no-compile -e ".[all,test]"
wait "$compiling"
compile "$site" runner recipes
echo "ready: .venv (torch $(torch_version))"
