"""Which process of a torchrun job this is, and its share of the work.

``ranks`` reads the process group (joined by ``attnsens.train.trainer.init_distributed``); ``first_rank`` reads
torchrun's ``RANK`` variable, which is set before any process group exists, so that a command knows from its start
whether it prints and writes.
"""

from __future__ import annotations

import os


def ranks() -> tuple[int, int]:
    """(rank, world size) of the torchrun process group this process belongs to, or (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def first_rank() -> bool:
    """Whether this process prints and writes: the only one, or rank 0 of a torchrun job."""
    return int(os.environ.get("RANK", "0")) == 0


def rank_share(count: int, rank: int, world: int) -> range:
    """The contiguous block of ``count`` items that ``rank`` of ``world`` takes: the first ``count % world`` ranks
    one more than the others."""
    size, extra = divmod(count, world)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (rank < extra))
