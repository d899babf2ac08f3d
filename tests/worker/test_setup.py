"""runner.worker.setup: what a rank inherits from its host agent, without a process: whether it runs a script, which
of the run folder's files are its own, and its error record (the first line, the traceback, the timeout verdict)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time

import pytest
from omegaconf import OmegaConf

from conftest import make_spec
from runner.records.outcomes import ErrorRecord, RankOutcome
from runner.records.paths import RunPaths
from runner.spec.place import RankPlace
from runner.spec.schema import SCRIPT_TARGET, DeviceKind, RecipeConfig, ScriptRecipeConfig
from runner.worker.relay import Echo
from runner.worker.setup import RankSetup

pytestmark = pytest.mark.unit

# the second process of the second host of a 2x2 job
PLACE = RankPlace(global_rank=3, local_rank=1, node_rank=1, world_size=4, local_world_size=2, host="node1",
                  device="cpu", device_ids=())


def setup_of(paths: RunPaths, recipe: RecipeConfig | None = None) -> RankSetup:
    spec = make_spec(nodes=2, devices_per_node=2)
    return RankSetup(spec=spec, recipe=recipe or spec.recipe, recipe_cfg=OmegaConf.create({}), place=PLACE,
                     backend="gloo", device=DeviceKind.cpu, init_method="env://", env={"RANK": "3"}, paths=paths,
                     stop_signal=signal.SIGUSR1)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 (any exception a rank may end with)
        return e


def test_a_setup_runs_a_script_under_recipe_script_typed_or_named_by_its_target(paths) -> None:
    assert not setup_of(paths).runs_script  # the digits recipe function
    assert setup_of(paths, ScriptRecipeConfig(path="train.py")).runs_script
    assert setup_of(paths, RecipeConfig(target=SCRIPT_TARGET)).runs_script  # recipe=custom naming the script runner


def test_a_ranks_files_are_those_of_its_global_rank_not_its_local_one(paths) -> None:
    setup = setup_of(paths)
    assert setup.outcome == RankOutcome(paths, 3)
    assert setup.log_file == paths.root / "logs" / "rank00003.log"


def test_a_setup_is_frozen_and_shows_nothing_on_the_terminal_unless_told(paths) -> None:
    setup = setup_of(paths)
    assert (setup.echo, setup.notes, setup.preflight) == (Echo(shown=False, prefix="", progress=False, live_bar=False),
                                                          (), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.env = {}  # type: ignore[misc]


def test_the_error_record_names_the_rank_this_machine_and_process_and_keeps_the_traceback_as_shown(paths) -> None:
    before = time.time()
    record = setup_of(paths).error_record(raised(ValueError("bad batch")), shown="what the rank printed\n")
    assert before <= record.timestamp <= time.time()
    assert dataclasses.replace(record, timestamp=0.0) == ErrorRecord(
        rank=3, local_rank=1, host="node1", machine=socket.gethostname(), pid=os.getpid(), timestamp=0.0,
        exception="ValueError: bad batch", traceback="what the rank printed\n", killed=False, timeout=False)


def test_an_exception_without_a_message_is_its_bare_name_and_its_traceback_is_formatted_here(paths) -> None:
    record = setup_of(paths).error_record(KeyboardInterrupt())
    assert (record.exception, record.traceback) == ("KeyboardInterrupt", "KeyboardInterrupt\n")
    raised_here = setup_of(paths).error_record(raised(RuntimeError("boom")))
    assert raised_here.traceback.startswith("Traceback (most recent call last):\n")
    assert raised_here.traceback.endswith("RuntimeError: boom\n")


def test_a_message_that_begins_with_newlines_is_recorded_from_its_first_words(paths) -> None:
    """RuntimeError("\\n\\nthe-real-message ..."): the status line shows the message, not "RuntimeError:"."""
    record = setup_of(paths).error_record(raised(RuntimeError("\n\nthe-real-message here\nand more")))
    assert record.exception == "RuntimeError: the-real-message here\nand more"


@pytest.mark.parametrize("exc, timeout", [
    (RuntimeError("Wait timeout"), True),  # init=file: the group did not form
    (ValueError("timeout_s must be > 0"), False),  # a recipe's own words about a timeout
])
def test_the_record_says_whether_torch_distributed_timed_out_from_the_exception_itself(paths, exc, timeout) -> None:
    assert setup_of(paths).error_record(exc).timeout is timeout


def test_a_timeout_that_caused_the_recipes_own_error_is_still_a_timeout(paths) -> None:
    try:
        raise ValueError("the step failed") from RuntimeError(
            "[gloo/transport/tcp/pair.cc:534] Timed out waiting 30000ms for recv operation to complete")
    except ValueError as e:
        record = setup_of(paths).error_record(e)
    assert (record.exception, record.timeout) == ("ValueError: the step failed", True)
