"""Constants of IEEE 754 float64 arithmetic, shared by the θ kernels and the directed rounding (``_rounding``).

Kept free of imports: the numba kernels read these numbers as compile-time constants (``_numba_cache`` hashes
this file with the kernel sources), and the Triton kernel receives them as arguments.
"""

from __future__ import annotations

UNIT_ROUNDOFF = 2.0**-53
"""u of IEEE float64 (round to nearest): half the distance from 1 to the next float64."""
