"""The machine's physical memory, which the memory budgets of the commands and the θ engine are shares of."""

from __future__ import annotations

import os
from collections.abc import Callable


def physical_memory() -> int:
    """Bytes of this machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def longest_in_memory(bytes_at: Callable[[int], int], longest: int) -> int | None:
    """The largest length n < ``longest`` whose ``bytes_at(n)`` (growing with n) fits in half of this machine's
    memory (``memory_budget``), at least 1; None when ``longest`` itself fits."""
    budget = memory_budget()
    if bytes_at(longest) <= budget:
        return None
    low, high = 1, longest  # bytes_at(high) does not fit; the search keeps the largest low that does
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if bytes_at(middle) <= budget else (low, middle)
    return low


def memory_budget() -> int:
    """Half of this machine's physical memory, in bytes: what one call may plan to hold at once."""
    return physical_memory() // 2
