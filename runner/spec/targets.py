"""A recipe target, from its name to the function: one way for validation and for every rank.

A target is ``package.module:function`` (or ``package.module``, meaning its ``main``). It is imported
as ``python -m`` would from the job's folder (``workdir``: the folder `run` was started from, pinned in
the run's spec so that tasks on other hosts use the same one): that folder first on ``sys.path``, then
the interpreter's own path (installed packages, the runner's bundled recipes as ``runner.recipes``).

:func:`load_target` is what a rank calls. Validation asks :func:`target_problem`, which runs that same
function in a forked child: nothing the module does when imported (threads, CUDA, ``torch._dynamo``)
reaches the process that later forks the ranks, and a module that imports here imports there.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TARGET_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$")
IMPORT_TIMEOUT_S = 300.0  # a module that takes longer to import is reported, not waited for


class TargetError(Exception):
    """The module imports, but what the target names is not a recipe function."""


def split_target(target: str) -> tuple[str, str]:
    """(module, function) of ``package.module:function``; the function defaults to ``main``."""
    module, _, function = target.partition(":")
    return module, function or "main"


def use_workdir(workdir: str | None) -> None:
    """Make the job's folder the first place modules are imported from (idempotent)."""
    if not workdir:
        return
    if workdir in sys.path:
        sys.path.remove(workdir)
    sys.path.insert(0, workdir)


def load_target(target: str, workdir: str | None) -> Callable[..., Any]:
    """The recipe function ``target`` names, imported with ``workdir`` first on the path. Raises what the
    import raises, or :class:`TargetError` when the module does not define a function by that name."""
    import importlib

    use_workdir(workdir)
    importlib.invalidate_caches()  # files made since this process last looked are found too
    module_name, function = split_target(target)
    module = importlib.import_module(module_name)
    where = getattr(module, "__file__", None) or "a namespace package"
    if not hasattr(module, function):
        defined = sorted(name for name, value in vars(module).items()
                         if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_"))
        raise TargetError(f"module {module_name!r} ({where}) defines no {function!r}"
                          + (f"; its functions: {', '.join(defined[:8])}" if defined else ""))
    value = getattr(module, function)
    if not callable(value):
        raise TargetError(f"{module_name}:{function} ({where}) is a {type(value).__name__}, not a function")
    try:
        inspect.signature(value).bind(None, None)
    except TypeError:
        raise TargetError(f"{module_name}:{function}{inspect.signature(value)} ({where}) cannot be called as "
                          f"{function}(ctx, cfg), as recipes are") from None
    except ValueError:
        pass  # no signature to read (a builtin): the call will tell
    return value


@dataclass(frozen=True)
class TargetProblem:
    """Why a target cannot be loaded, in words for the user."""

    message: str
    hint: str


def _describe(target: str, workdir: str | None, exc: BaseException) -> TargetProblem:
    module_name, function = split_target(target)
    if isinstance(exc, TargetError):
        return TargetProblem(str(exc), f"name the recipe function: recipe.target={module_name}:<function> "
                                       f"(without ':', `main`); it is called as function(ctx, cfg)")
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and (module_name == missing or module_name.startswith(missing + ".")):
        found = f" (looked in {workdir} first, then the installed packages)" if workdir else ""
        hint = ("start `run` from the folder that holds it, set workdir=<that folder>, or install it "
                "(pip install -e .) in the interpreter the ranks use")
        if module_name.split(".")[0] == "recipes":
            hint += f"; the bundled recipes are runner.recipes.*: recipe.target=runner.{target}"
        return TargetProblem(f"module {module_name!r} cannot be imported: no module named {missing!r}{found}", hint)
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and not f.filename.endswith(__file__)]
    at = f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return TargetProblem(f"importing {module_name!r} raised {type(exc).__name__}{': ' + text if text else ''}{at}",
                         "the ranks would fail the same way: fix the module, or install what it imports "
                         "in the interpreter the ranks use")


def target_problem(target: str, workdir: str | None, timeout_s: float = IMPORT_TIMEOUT_S) -> TargetProblem | None:
    """What a rank would meet loading ``target`` (:func:`load_target`), found in a forked child; None: it loads.
    The child's own output (a module that prints when imported) is discarded."""
    return target_trial(target, workdir, timeout_s).answer()


def target_trial(target: str, workdir: str | None, timeout_s: float = IMPORT_TIMEOUT_S) -> Trial:
    """:func:`target_problem`'s child forked now, its answer read when asked for (:meth:`Trial.answer`): the
    trial runs while this process does something else."""
    def load() -> None:
        load_target(target, workdir)

    return Trial.start(load, lambda e: _describe(target, workdir, e), split_target(target)[0], timeout_s)


def module_problem(module: str, workdir: str | None, timeout_s: float = IMPORT_TIMEOUT_S) -> TargetProblem | None:
    """What ``python -m module`` would meet finding ``module`` from ``workdir`` (its parent packages are imported,
    as ``python -m`` imports them; the module itself is not run), in a forked child; None: it is there."""
    def find() -> None:
        import importlib.util

        sys.path.insert(0, workdir or os.getcwd())  # `python -m`: the current folder first
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    def describe(exc: BaseException) -> TargetProblem:
        if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
            return TargetProblem(f"no module named {module!r} (looked in {workdir or os.getcwd()} first, then the "
                                 f"installed packages)", "start `run` from the folder `python -m` would start in, "
                                 "or name the module as `python -m` takes it: -- -m package.module")
        return _describe(module, workdir, exc)

    return Trial.start(find, describe, module, timeout_s).answer()


@dataclass
class Trial:
    """``work`` run in a forked child with no input and no output (:meth:`start`); its answer (:meth:`answer`): the
    problem ``describe`` made of what it raised, a problem of its own when it hangs or dies, None when it returned."""

    pid: int
    answers: int  # the pipe's end the child's answer is read from
    what: str
    deadline: float
    timeout_s: float
    _answer: TargetProblem | None = field(default=None, init=False)
    _read: bool = field(default=False, init=False)

    @classmethod
    def start(cls, work: Callable[[], None], describe: Callable[[BaseException], TargetProblem], what: str,
              timeout_s: float) -> Trial:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: work, answer, leave without running any of the parent's cleanup
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_RDWR)  # no input to wait for, no output to show
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            sys.stdout = sys.stderr = open(os.devnull, "w")  # also where Python's streams were replaced
            answer: dict[str, str] = {}
            try:
                work()
            except BaseException as e:  # noqa: BLE001 (SystemExit at import is a problem too)
                problem = describe(e)
                answer = {"message": problem.message, "hint": problem.hint}
            try:
                os.write(write_fd, json.dumps(answer).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        return cls(pid, read_fd, what, time.monotonic() + timeout_s, timeout_s)

    def answer(self) -> TargetProblem | None:
        """The child's answer, waited for until the deadline set when it started (read once, then kept); one it gave
        in time is its answer however late it is asked for."""
        if not self._read:
            self._answer, self._read = self._wait(), True
        return self._answer

    def _wait(self) -> TargetProblem | None:
        chunks = []
        try:
            # nothing said by the deadline (however late the answer is asked for, what it said in time counts)
            if not select.select([self.answers], [], [], max(0.0, self.deadline - time.monotonic()))[0]:
                os.kill(self.pid, signal.SIGKILL)
                return TargetProblem(f"importing {self.what!r} took longer than {self.timeout_s:g} s",
                                     "a module that waits for something when imported (input, a lock, the "
                                     "network) would hang every rank; move that work into the function")
            while chunk := os.read(self.answers, 65536):  # to the end: the child exits as soon as it has written
                chunks.append(chunk)
        finally:
            os.close(self.answers)
            os.waitpid(self.pid, 0)
        if not chunks:  # it died without answering: killed, or a crash in native code while importing
            return TargetProblem(f"importing {self.what!r} ended the process without an answer "
                                 f"(a crash in native code?)", "try `python -c 'import <module>'` in the job's folder")
        answer = json.loads(b"".join(chunks))
        return TargetProblem(answer["message"], answer["hint"]) if answer else None
