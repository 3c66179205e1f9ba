"""The loader's few collectives under ``torch.distributed``, each bounded in time.

Steps are equal by construction (the epoch plan), so nothing is exchanged per step.  What is
left: at loader start, every rank checks that all planned from the same shards and options; at
each epoch's end, that all yielded the same number of batches.  Both run on a gloo group of the
loader's own (whatever the trainer's backend), behind a monitored barrier, so a rank that hangs
or died is named after ``timeout`` seconds instead of every other rank blocking for gloo's 30
minutes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any


def dist_info() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialized, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def loader_group(timeout: float) -> Any:
    """A gloo process group for the loader's checks, or None without torch.distributed.

    Every rank must call it at the same point (``make_loader`` does).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))


class RankTimeout(RuntimeError):
    """A rank did not reach one of the loader's collectives in time; the message names it."""


def gather(group: Any, value: Any, *, timeout: float, where: str) -> list[Any]:
    """Every rank's ``value`` (plain data), after a barrier that names whoever does not come in ``timeout`` s."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    except RuntimeError as e:
        found = re.search(r"[Rr]anks? ([\d, ]+) failed", str(e))
        who = f"rank(s) {found.group(1).strip()}" if found else "another rank"
        raise RankTimeout(
            f"wdsprep loader, {where}: {who} did not answer within {timeout:g} s (rank {dist.get_rank()} "
            f"waited). A rank that stopped stepping or died: look at its log. If the ranks are only this far "
            f"apart (a long evaluation on one rank), raise make_loader(collective_timeout=...) ({e})") from None
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)  # plain dicts of numbers and strings we made
    return out
