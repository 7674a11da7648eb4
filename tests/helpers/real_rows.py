"""The tiny GPT's early attention rows (tests/data) and the integer meet-in-the-middle oracle on them."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import torch

from attnsens.theta import ThetaCertificate, ThetaMethod
from tests.helpers.soundness import assert_certificate_sound
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "tiny_gpt_early_rows.npz"

ORACLE_MAX_SUPPORT = 36
"""Rows up to this many keys are checked against the integer meet-in-the-middle oracle (2^18 sums, ~0.1 s)."""


def support(rows: torch.Tensor) -> torch.Tensor:
    return (rows > 0).sum(-1)


def dyadic(row: torch.Tensor) -> tuple[list[int], int]:
    """The row's non-zeros as integers times 2^-exponent, exactly."""
    fractions = [Fraction(v) for v in row.tolist() if v != 0]
    denominator = max(f.denominator for f in fractions)
    return [int(f * denominator) for f in fractions], denominator.bit_length() - 1


def oracle_rows(real_rows: torch.Tensor) -> torch.Tensor:
    """Rows short enough for the oracle whose values share a quantum small enough for its int64 sums."""
    rows = real_rows[support(real_rows) <= ORACLE_MAX_SUPPORT]
    keep = [max(dyadic(row)[0]) < 2**46 // row.numel() for row in rows]
    assert sum(keep) >= 0.8 * len(rows)
    return rows[torch.tensor(keep)]


def assert_enumerated_rows_equal_the_oracle(rows: torch.Tensor, cert: ThetaCertificate) -> None:
    """Every row exact, some by meet-in-the-middle, each interval holding the integer oracle's θ within 2^-49."""
    assert bool(cert.exact.all()), cert.method_names()
    assert ThetaMethod.MEET_IN_THE_MIDDLE in {ThetaMethod(int(m)) for m in cert.method}
    for i, row in enumerate(rows):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"real row {i}")
        assert float(cert.upper[i]) - float(cert.lower[i]) <= 2.0**-49
