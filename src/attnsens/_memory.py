"""The machine's physical memory, which the memory budgets of the commands and the θ engine are shares of."""

from __future__ import annotations

import os


def physical_memory() -> int:
    """Bytes of this machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
