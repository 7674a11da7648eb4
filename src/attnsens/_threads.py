"""Keep torch's intra-op thread count across calls into parallel numba kernels.

numba's OpenMP threading layer and torch share the process's OpenMP runtime: the first parallel numba call
sets the OpenMP thread count back to numba's own default, silently undoing a user's
``torch.set_num_threads``. Every parallel numba call in attnsens goes through this guard.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def keep_torch_threads() -> Iterator[None]:
    """Restore ``torch.get_num_threads()`` to its value on entry when the block exits."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
