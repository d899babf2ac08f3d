"""Whether an error says the rank lost a peer: its connection to another rank closed under it, because that rank's
process ended (it left early, or died). The texts are torch 2.13's, as gloo, NCCL and the c10d stores raise them; a
rank that ends while the others still run leaves them failing with these words, and the report then names the rank
that left (runner.worker.failures), not the first of those that lost it."""

from __future__ import annotations

import re

_LOST_PEER = re.compile(
    r"Connection closed by peer"  # gloo: the peer's end of the pair closed
    r"|Connection reset by peer"  # gloo, the stores: closed while data was in flight
    r"|Broken pipe"  # gloo: written to a closed connection
    r"|remote process exited or there was a network error"  # NCCL
    r"|failed to recv, got 0 bytes"  # the TCPStore: its server (host 0's store) went away
    r"|Socket closed", re.IGNORECASE)


def lost_a_peer(text: str) -> bool:
    """The error's text says its connection to another rank closed under it."""
    return bool(_LOST_PEER.search(text))
