"""Give freed heap memory back to the operating system between layers (glibc ``malloc_trim``; elsewhere a no-op).

PyTorch's CPU tensors come from the C allocator. Under glibc, blocks below the (adaptive, up to 32 MiB) mmap
threshold live in the heap, and the small statistics tensors a capture keeps land between freed chunk buffers,
so the heap cannot shrink from its top: without a trim, freed chunks of one layer stay resident while the next
layer allocates its own, and the resident set grows with the number of layers. ``malloc_trim(0)`` returns every
whole free page, wherever it sits in the heap, so the extra resident memory stays that of one layer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` or None (musl, macOS, Windows, or no C library found)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the operating system; True when the allocator supports it (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
