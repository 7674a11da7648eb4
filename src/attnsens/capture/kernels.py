"""capture's compiled kernels that other parts of attnsens reach: ``warmup`` compiles them ahead of a first audit.

Package-internal, as ``attnsens.theta.kernels`` is for theta: the dispatchers are capture's own, under public names,
so that nothing outside ``capture`` imports a private module of it (``tests/unit/test_layers.py``). Importing this
module imports numba.
"""

from __future__ import annotations

from attnsens.capture._numba_moments import row_moments as row_moments_rows
from attnsens.capture._numba_row_statistics import row_statistics_rows, row_statistics_rows_serial

__all__ = ["row_moments_rows", "row_statistics_rows", "row_statistics_rows_serial"]
