"""The few collectives the loader makes under ``torch.distributed``."""

from __future__ import annotations

from typing import Sequence


def dist_info() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialized, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _collective_device() -> "object":
    import torch
    import torch.distributed as dist

    # nccl only reduces CUDA tensors; gloo (CPU) reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank_done(done: bool) -> bool:
    """All-reduce (MAX) of this rank's "I have no batch" flag: True when any rank is out of data.

    Every rank must call it the same number of times; the loader calls it once per step.
    """
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if done else 0], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def all_sum(values: Sequence[int]) -> list[int]:
    """Element-wise sum of integers over ranks (one all-reduce)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.int64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [int(x) for x in t.tolist()]
