"""Python sources parsed once for every test that reads them (tests/test_architecture.py, tests/records/test_paths.py):
read only, no test changes a tree."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s tree, as :func:`ast.walk` gives them (walked once)."""
    return tuple(ast.walk(tree(path)))
