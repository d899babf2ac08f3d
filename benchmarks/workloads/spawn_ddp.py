"""The bare torch.multiprocessing way: mp.spawn a function that does tiny_ddp's 20 steps."""

import os
import socket
import sys

import torch.multiprocessing as mp


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    from tiny_ddp import main

    main()


if __name__ == "__main__":
    world = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port), nprocs=world)
