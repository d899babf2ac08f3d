#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "no tests were collected: that is a failure" >&2
  exit 1
fi
exit "$status"
