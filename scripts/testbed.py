#!/usr/bin/env python3
"""The test bed's command line: ``testbed.py up|down|env|exec --state DIR ...`` (run as root).

The bed itself is the package beside this file, one module per part (scripts/bed/: the plan, the network, the
processes, munge, Slurm, Open MPI's agent, up and down); its docstring says what ``up`` builds. Only the Python
standard library is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the `bed` package beside this file

from bed.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
