"""A rank that runs a torchrun-style script (recipe=script) as its main program, the way ``python -u script.py
args`` (or ``python -u -m module args``) started by torchrun runs it: the script cannot tell the difference
(docs/torchrun.md, "Differences from torchrun", lists what it could, and why).

* ``sys.argv`` is ``[the path as given, *args]`` (``-m``: the module's file, as ``python -m`` sets it);
  ``sys.orig_argv`` is the command torchrun would have run; ``sys.path[0]`` the script's folder (``-m``: the
  current folder) before the interpreter's own path; ``__main__`` is the script's module (``__file__`` absolute,
  as Python >= 3.9 sets it);
* it exits as Python exits: 0 when it ends, ``sys.exit``'s status, 2 when the file cannot be opened (removed after
  the spec was checked), 1 after an uncaught exception (the traceback
  printed from the script's first frame on, the runner's own below it left out), killed by SIGINT after an
  uncaught KeyboardInterrupt; ``os._exit`` and signals end the process itself, which its agent sees at once;
* the process group it makes without a timeout gets init.timeout_s, and its collectives are watched
  (runner.worker.watch), so that a hang names the ranks and where they are.

``recipe.local_rank_arg`` appends ``--local_rank=<n>`` (or ``--local-rank``), as torch.distributed.launch did.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import signal
import sys
import traceback
import types

from runner.common import exits
from runner.common.code_paths import in_runner
from runner.worker.channel import JobChannel
from runner.training.output import AgentChannel
from runner.worker.rank_body import exit_status, failed, watch_process_groups
from runner.worker.setup import RankSetup
from runner.worker.watch import Watch



def interpreter_path() -> list[str]:
    """``sys.path`` as the interpreter made it, without the entry of the program this process started as (`run`'s
    own folder; a ``-P -m`` task adds none): what a fresh ``python script.py`` has after the script's folder."""
    started_as = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    return [p for p in sys.path if p != started_as]


def run_script(setup: RankSetup, channel: JobChannel | None, agent: AgentChannel) -> int:
    """Run the script to its end in this process; its exit status. ``channel``: its job's (runner.worker.channel);
    ``agent``: its channel to its host agent (runner.training.output)."""
    cfg = setup.recipe_cfg
    args = [str(a) for a in cfg.get("args") or ()]
    if cfg.get("local_rank_arg"):
        args.append(f"{cfg.local_rank_arg}={setup.place.local_rank}")
    base = interpreter_path()
    module = cfg.get("module")
    watch_process_groups(setup, channel, agent, own=True)
    watch = Watch(setup, channel, agent=agent)
    watch.begin()
    try:
        if module:
            sys.path[:] = [setup.spec.code_dir or os.getcwd(), *base]  # the run's copy of the code, if it took one
            sys.orig_argv = [sys.executable, "-u", "-m", module, *args]
            sys.argv = [module, *args]  # run_module puts the module's file first, as `python -m` does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            given = str(cfg.path)
            path = os.path.abspath(given)
            # a file: its folder first, as Python makes it; a folder or zip file: itself, as the path was given
            first = os.path.join(os.getcwd(), given) if _is_main_container(path) else os.path.dirname(path)
            sys.path[:] = [first, *base]
            sys.orig_argv = [sys.executable, "-u", given, *args]
            sys.argv = [given, *args]
            _run_main(path)
    except SystemExit as e:
        code = exit_status(e)
        if code:
            said = f"{cfg.module or cfg.path} exited with status {code}"
            setup.outcome.record_error(setup.error_record(ScriptExit(said), ""))
        else:
            setup.outcome.mark_done(False)
        watch.finish()
        return code
    except KeyboardInterrupt as e:  # as Python: the traceback, then killed by SIGINT
        failed(setup, e, watch, _script_traceback(e))
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return exits.from_signal(signal.SIGINT)
    except BaseException as e:  # noqa: BLE001 (as Python: the traceback, status 1)
        failed(setup, e, watch, _script_traceback(e))
        return 1
    watch.finish()
    setup.outcome.mark_done(False)
    return 0


def _run_main(path: str) -> None:
    """Run the file at ``path`` as ``__main__`` in a fresh module, as ``python path`` does; a folder or zip file (first
    on sys.path), its ``__main__`` module, as ``python app/`` does: CPython's own call, runpy's private
    ``_run_module_as_main`` with sys.argv left as it is (tests/worker/test_script.py checks it is still there)."""
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    if _is_main_container(path):
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:  # as Python says it, and its status
        print(f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)  # type: ignore[attr-defined]
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _is_main_container(path: str) -> bool:
    """A folder, or a zip file not named .py: what Python runs by its ``__main__`` module."""
    return os.path.isdir(path) or not path.endswith(".py") and _is_zip(path)


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _script_traceback(exc: BaseException) -> str:
    """The traceback Python would print for ``exc`` in a script: from the script's first frame on (the runner's
    own, and runpy's, that called it left out)."""
    tb = exc.__traceback__
    while tb is not None and _is_launcher_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_launcher_frame(filename: str) -> bool:
    return in_runner(filename) or filename == runpy.__file__ or filename.startswith("<frozen runpy")


class ScriptExit(Exception):
    """The script called sys.exit with a failure status (argparse does, on arguments it refuses)."""
