#!/usr/bin/env bash
# The GPU checks in one call under one time limit (benchmarks/gpu_checks.py: each check its own budget, one line
# each, results in benchmarks/results/gpu_checks.json and REPORT.md's GPU section). Without CUDA every check is
# skipped and this ends 0. No network needed: the runner is installed from this checkout (no dependencies fetched)
# into .gpu-venv, made over the machine's own packages (its torch), unless the interpreter already has it; of the
# wheels in .gpu-wheels/ (made with network by scripts/gpu_wheelhouse.sh, carried with the checkout), those the machine
# lacks. The venv is made without pip (an interpreter may lack ensurepip) and uses the machine's.
# PYTHON: the interpreter (default .venv/bin/python if present, else python3); GPU_CHECKS_LIMIT: seconds (480).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
if ! "$python" -c 'import runner.conf, runner.app.start' 2>/dev/null; then
  if [ ! -x .gpu-venv/bin/python ]; then
    "$python" -m venv --system-site-packages --without-pip .gpu-venv
    # the packages of the interpreter given (its torch), wherever they are (a venv's, conda's, the system's): after
    # the new venv's own on the path
    paths='import sysconfig; print(*dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")), sep="\n")'
    "$python" -c "$paths" > "$(.gpu-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine.pth"
  fi
  if [ -d .gpu-wheels ]; then  # the runner's dependencies but torch, brought along: those the machine has not
    missing=$(.gpu-venv/bin/python - .gpu-wheels/*.whl <<'EOF'
import importlib.metadata, sys
for wheel in sys.argv[1:]:
    try:
        importlib.metadata.distribution(wheel.rsplit("/", 1)[-1].split("-")[0])
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
EOF
)
    if [ -n "$missing" ]; then
      # shellcheck disable=SC2086  # one wheel per word
      PIP_NO_INDEX=1 .gpu-venv/bin/python -m pip install -q --no-deps $missing
    fi
  fi
  PIP_NO_INDEX=1 .gpu-venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  python=.gpu-venv/bin/python
fi
exec timeout --kill-after=10 "${GPU_CHECKS_LIMIT:-480}" "$python" benchmarks/gpu_checks.py
