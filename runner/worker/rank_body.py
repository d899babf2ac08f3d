"""What a rank's two bodies share — the bundled recipe's (runner.worker.rank) and a user's script's
(runner.worker.script): the process group watched (made, destroyed: the agent hears both), a failure recorded and
shown, and the exit status a Python process would have. Both import it; it imports neither."""

from __future__ import annotations

import datetime
import functools
import sys
import time
import traceback
from typing import Any

from runner.common.lost_peers import lost_a_peer
from runner.environments import provenance
from runner.training.output import AgentChannel
from runner.worker.channel import JobChannel, ask_for_dumps
from runner.worker.setup import RankSetup
from runner.worker.watch import Watch

TIMEOUT_PAUSE_S = 1.0  # a rank whose collective timed out waits this long before exiting, so that its agent can
# ask the ranks it waited for where they are


def joined(setup: RankSetup, channel: JobChannel | None, backend: str, agent: AgentChannel) -> None:
    """The rank joined the process group: in its run folder, on the job's channel (the other hosts' reports), and to
    its agent."""
    setup.outcome.mark_joined(backend)
    if channel is not None:
        channel.say_joined(setup.paths.attempt, setup.place.global_rank)
    agent.life("joined")


def exit_status(e: SystemExit) -> int:
    """The status ``sys.exit(code)`` gives a Python process (its message, if any, printed as Python does)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def failed(setup: RankSetup, exc: BaseException, watch: Watch | None, shown: str | None = None) -> None:
    """A rank's body raised: record it (runner.records.outcomes), print the traceback (``shown``, else the whole
    one) to its stderr, and when a collective timed out, have every rank say where it is (runner.records.watch_files),
    this one first, and wait a moment for its agent to ask the others."""
    text = shown if shown is not None else "".join(traceback.format_exception(exc))
    record = setup.error_record(exc, text)
    setup.outcome.record_error(record)
    sys.stderr.write(text)
    sys.stderr.flush()
    if record.timeout:
        if watch is not None:
            ask_for_dumps(setup.paths, watch.channel, "timeout")
            watch.dump("timeout")
        time.sleep(TIMEOUT_PAUSE_S)
    elif watch is not None and lost_a_peer(text):  # its peer may have closed on another rank's timeout: the hang's
        watch.dump("lost a peer")  # diagnosis reads where this rank was, though it may end before anyone asks


def watch_process_groups(setup: RankSetup, channel: JobChannel | None, agent: AgentChannel, own: bool) -> None:
    """Every rank: joining the default process group is marked (with the backend it uses: runner.worker.failures tells
    a hang in its collectives from one that never formed), rank 0 records the runtime it loaded (provenance), and its
    agent hears when the group is made and when it is destroyed (runner.worker.rank_life: the end of a rank's work).
    ``own``: the recipe or script makes its own group; the groups it makes without a timeout get init.timeout_s
    rather than torch's 30 minutes (torch reads these public defaults when ``timeout`` is None)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if own:
        timeout = datetime.timedelta(seconds=setup.spec.init.timeout_s)
        c10d.default_pg_timeout = timeout
        c10d.default_pg_nccl_timeout = timeout
    make, destroy = dist.init_process_group, dist.destroy_process_group

    @functools.wraps(make)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        make(*args, **kwargs)
        joined(setup, channel, str(dist.get_backend()), agent)
        _record_runtime(setup)

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> None:
        default = _is_default_group(args[0] if args else kwargs.get("group"))
        destroy(*args, **kwargs)
        if default:
            agent.life("destroyed")

    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def _is_default_group(group: Any) -> bool:
    from torch.distributed.distributed_c10d import GroupMember

    return group is None or group is GroupMember.WORLD


def _record_runtime(setup: RankSetup) -> None:
    place, paths = setup.place, setup.paths
    if place.is_main:
        provenance.add_runtime(paths.provenance, provenance.runtime(setup.device.value), place.host, paths.attempt)
