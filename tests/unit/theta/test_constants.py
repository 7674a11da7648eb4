"""The cascade's soundness-critical constants have one source (``theta/_constants.py``; the unit roundoff u,
shared with the directed rounding, ``attnsens/_float64.py``) for all backends."""

from __future__ import annotations

from pathlib import Path

import pytest

import attnsens.theta as theta_package
from attnsens import _float64
from attnsens.theta import _constants

BACKENDS = ("_numba_kernels.py", "_numba_partition.py", "_numba_enumeration.py", "_numba_cardinality.py",
            "_numba_four_list.py", "_numba_first_fit.py", "_numba_refine.py", "_numba_scan.py", "_torch_path.py",
            "_triton_kernel.py", "_enclosure.py", "certificate.py")  # fmt: skip
LITERALS = ("2.0**-53", "2.0**-1000", "2.0**-10", "K_SMALL = ", "K_LARGE = ", "N_TARGETS = ", "SWAP_ROUNDS = ",
            "UNIT_ROUNDOFF = ", "MITM_CHEAP_SUPPORT = ", "16.0)")  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_backend_restates_a_constant(backend: str) -> None:
    source = (Path(theta_package.__file__).parent / backend).read_text(encoding="utf-8")
    restated = [literal for literal in LITERALS if literal in source]
    where = "attnsens.theta._constants (u from attnsens._float64)"
    assert not restated, f"{backend} restates {restated}; import them from {where}"


def test_backends_read_the_shared_values() -> None:
    from attnsens.theta import _enclosure, _torch_path

    assert _torch_path.K_SMALL == _constants.K_SMALL and _torch_path.N_TARGETS == _constants.N_TARGETS
    assert _enclosure.UNIT_ROUNDOFF == _float64.UNIT_ROUNDOFF == 2.0**-53
