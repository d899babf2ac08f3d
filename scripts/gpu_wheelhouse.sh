#!/usr/bin/env bash
# The wheels scripts/gpu_checks.sh installs on a GPU machine without network (Python 3.12, its own torch): the runner's
# dependencies but torch, for CPython 3.12 on Linux x86_64, into .gpu-wheels/ (git-ignored; carry it with the
# checkout; about 30 MB). scikit-learn without its own dependencies: the digits recipe reads the data file it ships and imports
# nothing of it. Run here, with network: bash scripts/gpu_wheelhouse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-wheels
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
target=(--python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
        --only-binary=:all: --no-deps --dest "$out")
"$py" -m pip download -q "${target[@]}" "hydra-core>=1.3.2,<1.4" "omegaconf>=2.3,<2.4" "PyYAML>=5.1" "psutil>=5.9" \
  "tqdm>=4.66" "packaging" "scikit-learn>=1.3" "numpy" "setuptools>=70.1"  # numpy: fairscale's; setuptools: the
# editable install of this checkout (a Python 3.12 venv has none of its own)
# pure-Python packages published as sources only: built here, for any Python 3
"$py" -m pip wheel -q --no-deps --wheel-dir "$out" "antlr4-python3-runtime==4.9.3" "fairscale>=0.4.13"
ls "$out"
du -sh "$out"
