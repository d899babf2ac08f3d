"""runner.worker.script, in this process: real scripts and modules under tmp_path run as a rank runs them, and
what each saw (argv, its command line, sys.path, ``__main__``) and how its end became the rank's status and outcome."""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import os
import runpy
import signal
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from conftest import make_spec
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles
from runner.spec.document import recipe_config
from runner.spec.place import RankPlace
from runner.spec.schema import DeviceKind, InitConfig, ScriptRecipeConfig
from runner.worker.relay import Echo
from runner.training.output import AgentChannel
from runner.worker.script import interpreter_path, run_script
from runner.worker.setup import RankSetup
from runner.worker.watch import Watch, _Counter

TIMEOUT_S = 42.0  # the job's init.timeout_s: the script's own process group gets it

# What a script (or module) saw of its process, written as JSON to the file its last argument names.
PROBE = """\
import json
import sys

import __main__
import torch.distributed.distributed_c10d as c10d

seen = {"argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "file": __file__, "name": __name__,
        "main_is_this": __main__.__dict__ is globals(), "pg_timeout_s": c10d.default_pg_timeout.total_seconds()}
with open(sys.argv[-1], "w") as f:
    json.dump(seen, f)
"""

NO_AGENT = AgentChannel(os.open(os.devnull, os.O_WRONLY), False)  # what the rank tells its agent: nobody hears


@pytest.fixture(autouse=True)
def this_process(tmp_path, monkeypatch):
    """Everything a script's run changes in this process, put back after the test: argv, the command line,
    sys.path, ``__main__``, the modules it imported, the current folder, torch.distributed's defaults and the
    functions it wraps, SIGINT's handler; and the watch it started, finished. The runner is started as
    ``<tmp_path>/bin/run``, and its folder is the first of sys.path, as Python makes it."""
    starter = tmp_path / "bin"
    monkeypatch.setattr(sys, "argv", [str(starter / "run")])
    monkeypatch.setattr(sys, "orig_argv", list(sys.orig_argv))
    monkeypatch.setattr(sys, "path", [str(starter), *sys.path])
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    for name in ("default_pg_timeout", "default_pg_nccl_timeout", "init_process_group", "destroy_process_group"):
        monkeypatch.setattr(c10d, name, getattr(c10d, name))
    for name in ("init_process_group", "destroy_process_group", *_Counter.OPS):
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, getattr(dist, name))
    monkeypatch.chdir(tmp_path)
    modules = set(sys.modules)
    threads = set(threading.enumerate())
    sigint = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, sigint)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    for thread in set(threading.enumerate()) - threads:
        if isinstance(thread, Watch):  # a script that raised leaves its watch to its process's end
            thread.finish()
            thread.join()


def script_setup(tmp_path: Path, code_dir: Path | None = None, **recipe) -> RankSetup:
    """Rank 1 (local rank 1 of host 0) of a 2-rank CPU job whose recipe is recipe=script with ``recipe``; its run
    folder under tmp_path."""
    script = ScriptRecipeConfig(**recipe)
    spec = dataclasses.replace(make_spec(nodes=1, devices_per_node=2, init=InitConfig(timeout_s=TIMEOUT_S)),
                               recipe=script, code_dir=str(code_dir) if code_dir else None)
    paths = RunPaths(tmp_path / "runs", "r1")
    paths.make()
    place = RankPlace(global_rank=1, local_rank=1, node_rank=0, world_size=2, local_world_size=2, host="node0",
                      device="cpu", device_ids=())
    return RankSetup(spec=spec, recipe=script, recipe_cfg=recipe_config(script), place=place, backend="gloo",
                     device=DeviceKind.cpu, init_method="env://", env={}, paths=paths, stop_signal=signal.SIGTERM,
                     echo=Echo())


def written(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def probe_module(folder: Path, package: str) -> Path:
    """``<folder>/<package>/train.py``, the probe, in a package: what ``-m <package>.train`` runs."""
    written(folder / package / "__init__.py", "")
    return written(folder / package / "train.py", PROBE)


def the_rank_ended(setup: RankSetup) -> tuple[bool, dict | None]:
    """Whether it marked itself done, and its error record's exception and traceback (None: none)."""
    error = setup.outcome.error()
    return setup.outcome.done, None if error is None else {"exception": error.exception, "traceback": error.traceback}


def test_the_runners_own_folder_is_not_on_the_path_it_gives_a_script(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/opt/env/bin/run", "x"])
    monkeypatch.setattr(sys, "path", ["/opt/env/bin", "/usr/lib/python3.11", "/opt/env/bin", "/opt/env/site"])
    assert interpreter_path() == ["/usr/lib/python3.11", "/opt/env/site"]
    monkeypatch.setattr(sys, "argv", [""])  # `python -c`, an interactive session: no program's folder to leave out
    assert interpreter_path() == ["/opt/env/bin", "/usr/lib/python3.11", "/opt/env/bin", "/opt/env/site"]


def test_a_script_sees_its_process_as_python_script_py_args_makes_it(tmp_path) -> None:
    written(tmp_path / "train.py", PROBE)
    base = [p for p in sys.path if p != str(tmp_path / "bin")]
    setup = script_setup(tmp_path, path="train.py", args=["--lr=0.1", "a b", "it's", "seen.json"])
    assert run_script(setup, None, NO_AGENT) == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": ["train.py", "--lr=0.1", "a b", "it's", "seen.json"],
                    "orig_argv": [sys.executable, "-u", "train.py", "--lr=0.1", "a b", "it's", "seen.json"],
                    "path": [str(tmp_path), *base], "file": str(tmp_path / "train.py"), "name": "__main__",
                    "main_is_this": True, "pg_timeout_s": TIMEOUT_S}
    assert the_rank_ended(setup) == (True, None) and not setup.outcome.returned_on_request


def test_a_script_in_another_folder_has_that_folder_first_on_its_path(tmp_path) -> None:
    written(tmp_path / "code" / "train.py", PROBE)
    setup = script_setup(tmp_path, path="code/train.py", args=[str(tmp_path / "seen.json")])
    assert run_script(setup, None, NO_AGENT) == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["code/train.py", str(tmp_path / "seen.json")]  # the path as given, as Python keeps it
    assert (seen["path"][0], seen["file"]) == (str(tmp_path / "code"), str(tmp_path / "code" / "train.py"))


@pytest.mark.parametrize("given", ["app", "./app/", "app.zip", str(Path("/").joinpath("TMP", "app"))])
def test_a_folder_or_zip_file_runs_its_main_module_as_python_app_does(tmp_path, given: str) -> None:
    """`python app/` (CPython 3.11 and 3.12, checked by hand): sys.argv[0] is the path as given, sys.path[0] the
    current folder joined with it (not normalised: '/cwd/./app/'), ``__file__`` the ``__main__.py`` in it, run in a
    fresh ``__main__``; the folder that holds it is not on the path."""
    given = given.replace("/TMP", str(tmp_path))
    written(tmp_path / "app" / "__main__.py", PROBE)
    written(tmp_path / "app" / "helper.py", "")
    if given == "app.zip":
        with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
            z.write(tmp_path / "app" / "__main__.py", "__main__.py")
    base = [p for p in sys.path if p != str(tmp_path / "bin")]
    setup = script_setup(tmp_path, path=given, args=["seen.json"])
    assert run_script(setup, None, NO_AGENT) == 0
    first = os.path.join(str(tmp_path), given)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [given, "seen.json"], "orig_argv": [sys.executable, "-u", given, "seen.json"],
                    "path": [first, *base], "file": os.path.join(first, "__main__.py"), "name": "__main__",
                    "main_is_this": True, "pg_timeout_s": TIMEOUT_S}
    assert the_rank_ended(setup) == (True, None)


def test_runpys_private_call_for_a_folder_is_still_there() -> None:
    """What CPython calls for `python app/`, and runner.worker.script with it."""
    assert callable(runpy._run_module_as_main)
    assert list(inspect.signature(runpy._run_module_as_main).parameters) == ["mod_name", "alter_argv"]


@pytest.mark.parametrize("flag", ["--local_rank", "--local-rank"])
def test_local_rank_arg_appends_the_local_rank_as_torch_distributed_launch_did(tmp_path, flag: str) -> None:
    written(tmp_path / "train.py", "import sys\nopen('seen.txt', 'w').write(repr(sys.argv))\n")
    setup = script_setup(tmp_path, path="train.py", args=["--lr=0.1"], local_rank_arg=flag)
    assert run_script(setup, None, NO_AGENT) == 0
    assert (tmp_path / "seen.txt").read_text() == repr(["train.py", "--lr=0.1", f"{flag}=1"])
    assert sys.orig_argv == [sys.executable, "-u", "train.py", "--lr=0.1", f"{flag}=1"]


def test_a_module_runs_as_python_m_runs_it_from_the_current_folder(tmp_path) -> None:
    module_file = probe_module(tmp_path, "pkg_cwd")
    base = [p for p in sys.path if p != str(tmp_path / "bin")]
    setup = script_setup(tmp_path, module="pkg_cwd.train", args=["--lr=0.1", "seen.json"])
    assert run_script(setup, None, NO_AGENT) == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [str(module_file), "--lr=0.1", "seen.json"],
                    "orig_argv": [sys.executable, "-u", "-m", "pkg_cwd.train", "--lr=0.1", "seen.json"],
                    "path": [str(tmp_path), *base], "file": str(module_file), "name": "__main__",
                    "main_is_this": True, "pg_timeout_s": TIMEOUT_S}
    assert the_rank_ended(setup) == (True, None)


def test_a_module_comes_from_the_runs_copy_of_the_code_when_it_took_one(tmp_path) -> None:
    written(tmp_path / "pkg_copy" / "__init__.py", "")
    written(tmp_path / "pkg_copy" / "train.py", "raise SystemExit('the folder, not the copy')\n")
    copied = probe_module(tmp_path / "copy", "pkg_copy")
    setup = script_setup(tmp_path, code_dir=tmp_path / "copy", module="pkg_copy.train", args=["seen.json"])
    assert run_script(setup, None, NO_AGENT) == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert (seen["argv"][0], seen["path"][0]) == (str(copied), str(tmp_path / "copy"))


@pytest.mark.parametrize("body", ["x = 1\n", "import sys\nsys.exit()\n", "import sys\nsys.exit(0)\n",
                                  "raise SystemExit(None)\n"])
def test_a_script_that_ends_or_exits_0_is_done_with_status_0(tmp_path, capsys, body: str) -> None:
    written(tmp_path / "train.py", body)
    setup = script_setup(tmp_path, path="train.py")
    assert run_script(setup, None, NO_AGENT) == 0
    assert the_rank_ended(setup) == (True, None)
    assert RankWatchFiles(setup.paths, 1).dump().reason == "end"  # its last dump: the run's straggler is found from it
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("body, status", [("sys.exit(3)", 3), ("sys.exit(259)", 3), ("sys.exit(-1)", 255)])
def test_sys_exit_with_a_failure_status_is_the_ranks_status(tmp_path, capsys, body: str, status: int) -> None:
    """As a process's: the status modulo 256."""
    written(tmp_path / "train.py", f"import sys\n{body}\n")
    setup = script_setup(tmp_path, path="train.py")
    assert run_script(setup, None, NO_AGENT) == status
    assert the_rank_ended(setup) == (False, {"exception": f"ScriptExit: train.py exited with status {status}",
                                             "traceback": ""})
    assert RankWatchFiles(setup.paths, 1).dump().reason == "end"
    assert capsys.readouterr().err == ""


def test_sys_exit_with_a_message_prints_it_and_is_status_1(tmp_path, capsys) -> None:
    written(tmp_path / "train.py", "import sys\nsys.exit('no data in /data/x')\n")
    setup = script_setup(tmp_path, path="train.py")
    assert run_script(setup, None, NO_AGENT) == 1
    assert capsys.readouterr().err == "no data in /data/x\n"
    assert the_rank_ended(setup) == (False, {"exception": "ScriptExit: train.py exited with status 1",
                                             "traceback": ""})


def test_arguments_argparse_refuses_are_its_usage_and_status_2(tmp_path, capsys) -> None:
    written(tmp_path / "train.py", "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', "
                                   "type=float, required=True)\np.parse_args()\n")
    setup = script_setup(tmp_path, path="train.py", args=["--lr", "fast"])
    assert run_script(setup, None, NO_AGENT) == 2
    assert capsys.readouterr().err == ("usage: train.py [-h] --lr LR\n"
                                       "train.py: error: argument --lr: invalid float value: 'fast'\n")
    assert the_rank_ended(setup) == (False, {"exception": "ScriptExit: train.py exited with status 2",
                                             "traceback": ""})


def raises_as_python(setup: RankSetup, capsys, exception: str, shown: str) -> None:
    """The script raised: status 1, ``shown`` (the traceback from its first frame) on stderr, and the rank's record
    of ``exception`` with it."""
    assert run_script(setup, None, NO_AGENT) == 1
    assert capsys.readouterr().err == shown
    assert the_rank_ended(setup) == (False, {"exception": exception, "traceback": shown})


def test_an_exception_is_status_1_with_the_traceback_from_the_scripts_first_frame(tmp_path, capsys) -> None:
    script = written(tmp_path / "train.py", "def main():\n    raise ValueError('boom')\n\n\nmain()\n")
    shown = (f'Traceback (most recent call last):\n  File "{script}", line 5, in <module>\n    main()\n'
             f'  File "{script}", line 2, in main\n    raise ValueError(\'boom\')\nValueError: boom\n')
    raises_as_python(script_setup(tmp_path, path="train.py"), capsys, "ValueError: boom", shown)


def test_a_modules_traceback_leaves_runpy_out(tmp_path, capsys) -> None:
    module = written(tmp_path / "pkg_raise" / "train.py", "raise KeyError('lr')\n")
    written(tmp_path / "pkg_raise" / "__init__.py", "")
    shown = (f'Traceback (most recent call last):\n  File "{module}", line 1, in <module>\n'
             f'    raise KeyError(\'lr\')\nKeyError: \'lr\'\n')
    raises_as_python(script_setup(tmp_path, module="pkg_raise.train"), capsys, "KeyError: 'lr'", shown)


def test_a_missing_script_is_status_2_as_python_says_it(tmp_path, capsys) -> None:
    """`python gone.py`: "<interpreter>: can't open file '<absolute path>': [Errno 2] No such file or directory",
    status 2 (the spec's check refuses a missing script first: only one removed in between gets here)."""
    setup = script_setup(tmp_path, path="gone.py")
    assert run_script(setup, None, NO_AGENT) == 2
    said = f"{sys.executable}: can't open file '{tmp_path / 'gone.py'}': [Errno 2] No such file or directory"
    assert capsys.readouterr().err == said + "\n"  # no frame of the runner's
    assert the_rank_ended(setup) == (False, {"exception": "ScriptExit: gone.py exited with status 2", "traceback": ""})


def test_a_folder_without_a_main_module_is_status_1_as_python_says_it(tmp_path, capsys) -> None:
    (tmp_path / "app").mkdir()
    setup = script_setup(tmp_path, path="app")
    assert run_script(setup, None, NO_AGENT) == 1
    assert capsys.readouterr().err == f"{sys.executable}: can't find '__main__' module in '{tmp_path / 'app'}'\n"



def test_a_missing_module_is_status_1_as_python_m_says(tmp_path, capsys) -> None:
    setup = script_setup(tmp_path, module="no_such_module_here")
    assert run_script(setup, None, NO_AGENT) == 1
    said = "ImportError: No module named no_such_module_here"
    assert capsys.readouterr().err == said + "\n"
    assert the_rank_ended(setup) == (False, {"exception": said, "traceback": said + "\n"})


def test_an_uncaught_keyboard_interrupt_ends_the_rank_by_sigint(tmp_path, capsys, monkeypatch) -> None:
    """As Python: the traceback, then the process kills itself with SIGINT at its default action (here the signal
    is taken, not sent, so that it ends the script's run rather than the test's)."""
    script = written(tmp_path / "train.py", "raise KeyboardInterrupt\n")
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum, signal.getsignal(signum))))
    setup = script_setup(tmp_path, path="train.py")
    assert run_script(setup, None, NO_AGENT) == 130
    assert sent == [(os.getpid(), signal.SIGINT, signal.SIG_DFL)]
    shown = (f'Traceback (most recent call last):\n  File "{script}", line 1, in <module>\n'
             f'    raise KeyboardInterrupt\nKeyboardInterrupt\n')
    assert capsys.readouterr().err == shown
    assert the_rank_ended(setup) == (False, {"exception": "KeyboardInterrupt", "traceback": shown})


def test_the_scripts_own_process_group_gets_the_jobs_init_timeout(tmp_path) -> None:
    written(tmp_path / "train.py", "import torch.distributed as dist\nimport torch.distributed.distributed_c10d as c\n"
                                   "open('seen.txt', 'w').write(repr((c.default_pg_timeout, c.default_pg_nccl_timeout,"
                                   " dist.init_process_group is c.init_process_group)))\n")
    original = dist.init_process_group
    setup = script_setup(tmp_path, path="train.py")
    assert run_script(setup, None, NO_AGENT) == 0
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    assert (tmp_path / "seen.txt").read_text() == repr((timeout, timeout, True))
    assert dist.init_process_group is not original and dist.init_process_group.__wrapped__ is original
