"""Every input-error path raises an AttnsensError whose message names the row and the fix."""

from __future__ import annotations

import pytest
import torch

from attnsens.errors import ConfigError, InputError, ShapeError
from attnsens.theta import certify, exact

BACKENDS = ("numba", "torch")


def _batch() -> torch.Tensor:
    return torch.full((2, 3, 5), 0.2, dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("value", "needle", "fix"),
    [
        (float("nan"), "nan", "finite"),
        (float("inf"), "inf", "finite"),
        (-0.1, "negative", "softmax outputs"),
    ],
)
def test_bad_values_name_the_row(backend: str, value: float, needle: str, fix: str) -> None:
    p = _batch()
    p[1, 2, 3] = value
    with pytest.raises(InputError) as info:
        certify(p, backend=backend)
    message = str(info.value)
    assert "row 5" in message and "(1, 2)" in message and "key 3" in message
    assert needle in message.lower() and fix in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_row(backend: str) -> None:
    p = _batch()
    p[0, 1] = 0.0
    with pytest.raises(InputError, match=r"row 1 \(index \(0, 1\).*empty.*drop fully masked rows"):
        certify(p, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_sum_and_the_normalize_fix(backend: str) -> None:
    p = _batch()
    p[1, 0] = 0.25
    with pytest.raises(InputError, match=r"row 3 .*sums to 1\.25.*normalize=True"):
        certify(p, backend=backend)
    cert = certify(p, normalize=True, backend=backend)
    assert float(cert.row_sum[1, 0]) == pytest.approx(1.0, abs=1e-15)
    assert bool(certify(p, tolerance=0.3, backend=backend).exact.all())


def test_argument_errors() -> None:
    with pytest.raises(InputError, match="empty"):
        certify(torch.zeros(3, 0))
    with pytest.raises(InputError, match=r"dtype torch\.int64"):
        certify(torch.ones(3, 2, dtype=torch.int64))
    with pytest.raises(InputError, match=r"torch\.Tensor"):
        certify([0.5, 0.5])  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="dim=2"):
        certify(torch.ones(3, 2) / 2, dim=2)
    with pytest.raises(ShapeError, match="0-d"):
        certify(torch.tensor(1.0))
    with pytest.raises(ConfigError, match="precision"):
        certify(torch.ones(2) / 2, precision="float16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="backend"):
        certify(torch.ones(2) / 2, backend="cuda")  # type: ignore[arg-type]


def test_normalize_still_rejects_bad_values() -> None:
    p = _batch()
    p[0, 0, 0] = -1.0
    with pytest.raises(InputError, match="negative"):
        certify(p, normalize=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_whose_sum_overflows_is_named_as_such_when_renormalised(backend: str) -> None:
    """Finite values whose float64 sum is infinite: renormalising would divide by inf and leave zeros, which the
    cascade used to report as an empty row."""
    p = torch.tensor([[0.5, 0.5], [1e308, 1e308]], dtype=torch.float64)
    for call in (lambda: certify(p, normalize=True, backend=backend), lambda: exact(p, normalize=True)):
        with pytest.raises(InputError, match=r"row 1 .*sums to inf.*rescale the row"):
            call()


def test_exact_accepts_the_row_sums_certify_accepts_for_the_dtype() -> None:
    """bfloat16 rows sum to 1 only within a few units of 2^-8: exact's default tolerance is certify's."""
    p = torch.tensor([0.5, 0.5078125], dtype=torch.bfloat16)  # s = 1 + 2^-7, within 2^-6
    cert = certify(p)
    assert bool(cert.exact) and float(exact(p)) == pytest.approx(float(cert.lower), abs=1e-15)
    with pytest.raises(InputError, match=r"tolerance 0\.001"):
        exact(p, tolerance=1e-3)
