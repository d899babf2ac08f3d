"""A script written for mpirun: its place from Open MPI's variables, the master from -x MASTER_ADDR.

    mpirun -np 4 -H node-a:2,node-b:2 -x MASTER_ADDR=node-a -x MASTER_PORT=29500 python mpi_style.py
"""

import os

import torch.distributed as dist

from common import device_for, train_and_record

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
device = device_for(local_rank)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", rank=rank,
                        world_size=world_size)
train_and_record("mpi_style", local_rank, device)
dist.destroy_process_group()
