"""runner.common.lost_peers: the words torch uses when a rank's connection to another rank closed under it."""

from __future__ import annotations

import pytest

from runner.common.lost_peers import lost_a_peer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text", [
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:13463. This is typically caused by a remote worker crashing.",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
    "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error",
])
def test_torchs_words_for_a_closed_connection_are_a_lost_peer(text) -> None:
    assert lost_a_peer(text)


@pytest.mark.parametrize("text", ["ValueError: rank 1 gives up", "RuntimeError: Timed out waiting 5000ms for recv",
                                  "RuntimeError: CUDA out of memory"])
def test_other_errors_are_not(text) -> None:
    assert not lost_a_peer(text)
