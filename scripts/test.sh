#!/usr/bin/env bash
# Set up everything (scripts/setup.sh: .venv; scripts/system_packages.sh: Slurm, munge, Open MPI, ...),
# then run the whole test suite. The tests start their own Slurm cluster and network-namespace hosts
# (scripts/testbed.py) and stop them. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/system_packages.sh --dev
export RUNNER_TESTBED=required  # the test bed is set up above: not being able to make one is a failure
set +e
# -P: the checkout is not on the tests' path (a user's is not either); the runner finds it installed
# -n: tests run on TEST_WORKERS workers at once (pytest-xdist; many wait on Slurm, a timeout or another host: on 2
# cores, 3 workers left the CPUs idle 8% of the time, all three waiting, 4 keep them 98% busy),
# a file's tests on one worker (its module fixtures made once), the longest files first (tests/scheduling.py; not
# xdist's own order, by number of tests); the workers share one test bed
# -m "not gpu": the GPU tests (tests/gpu) are scripts/gpu_checks.sh's, on a machine with CUDA; here they would only be
# skipped (a later -m in "$@" replaces this one)
.venv/bin/python -P -m pytest -p no:cacheprovider -n "${TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder -m "not gpu" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "no tests were collected: that is a failure" >&2
  exit 1
fi
exit "$status"
