"""Hypothesis properties of certify: permutation invariance, batching, docs/math.md T2 envelopes, dominant exactness."""

from __future__ import annotations

from fractions import Fraction

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnsens.theta import ThetaMethod, certify
from attnsens.theta.certificate import PARALLEL_MIN_ELEMENTS
from tests.unit.theta.rows import error_radius

BACKENDS = ("numba", "torch")


@st.composite
def rows(draw, min_length: int = 1, max_length: int = 40) -> torch.Tensor:
    """A float64 probability row (normalised in float64) with random zeros and a random temperature."""
    length = draw(st.integers(min_length, max_length))
    seed = draw(st.integers(0, 2**31 - 1))
    sigma = draw(st.sampled_from([0.25, 1.0, 4.0, 16.0]))
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(length, generator=gen, dtype=torch.float64)
    zero = torch.rand(length, generator=gen) < draw(st.sampled_from([0.0, 0.3, 0.7]))
    zero[int(torch.randint(length, (1,), generator=gen))] = False
    p = torch.where(zero, 0.0, torch.softmax(sigma * z, -1))
    return p / p.sum()


def slack(row: torch.Tensor) -> float:
    """Rounding allowance of a certified bound versus a float64-evaluated closed form."""
    return 8.0 * error_radius(row) + 2.0**-45


@given(rows(), st.integers(0, 2**31 - 1), st.sampled_from(BACKENDS))
def test_permutation_invariance(row: torch.Tensor, seed: int, backend: str) -> None:
    perm = torch.randperm(row.numel(), generator=torch.Generator().manual_seed(seed))
    a = certify(row, backend=backend)
    b = certify(row[perm], backend=backend)
    assert a.lower <= b.upper and b.lower <= a.upper
    if bool(a.exact) and bool(b.exact):
        torch.testing.assert_close(a.lower, b.lower, rtol=0, atol=slack(row))
        torch.testing.assert_close(a.upper, b.upper, rtol=0, atol=slack(row))


@given(st.lists(rows(max_length=30), min_size=1, max_size=6), st.sampled_from(BACKENDS))
def test_batching_equals_row_by_row(batch_rows: list[torch.Tensor], backend: str) -> None:
    width = max(r.numel() for r in batch_rows)
    batch = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in batch_rows])
    cert = certify(batch, backend=backend)
    for i, row in enumerate(batch):
        single = certify(row, backend=backend)
        torch.testing.assert_close(cert.lower[i], single.lower, rtol=0, atol=0)
        torch.testing.assert_close(cert.upper[i], single.upper, rtol=0, atol=0)
        assert bool(cert.exact[i]) == bool(single.exact)


@given(rows(), st.sampled_from(BACKENDS))
def test_envelope_and_collision_bounds(row: torch.Tensor, backend: str) -> None:
    """docs/math.md T2(b,c) for the stored s: θ ≥ max(4m(s − m), s − m²) ≥ s − ‖p‖² — the lower bound attains it."""
    cert = certify(row, backend=backend)
    s, m = float(cert.row_sum), float(cert.p_max)
    envelope = max(4 * m * (s - m), s - m * m)
    assert float(cert.lower) >= envelope - slack(row)
    assert float(cert.lower) >= s - float((row * row).sum()) - slack(row)
    assert float(cert.upper) >= envelope - slack(row)


@given(rows(min_length=2), st.floats(0.5, 0.999), st.sampled_from(BACKENDS))
def test_dominant_atom_is_exact(row: torch.Tensor, m: float, backend: str) -> None:
    """p_max ≥ s/2 (with a margin above rounding) ⇒ exact and θ = s − (2m − s)² (docs/math.md T2(a))."""
    p = torch.cat([torch.tensor([m], dtype=torch.float64), row * (1 - m)])
    cert = certify(p, backend=backend)
    values = [Fraction(v) for v in p.tolist()]
    s = sum(values)
    theta = s - (2 * max(values) - s) ** 2
    assert Fraction(float(cert.lower)) <= theta <= Fraction(float(cert.upper))
    if 2 * max(values) - s > 4 * error_radius(p):
        assert bool(cert.exact)
        assert int(cert.method) in (ThetaMethod.DOMINANT_ATOM, ThetaMethod.MEET_IN_THE_MIDDLE)


def test_long_rows_do_not_depend_on_their_neighbours() -> None:
    """First-fit walks four rows at once and stops early once all four are refined, and large batches run on the
    thread pool: every row's certificate must still be its own — equal alone (one thread), in a batch and in a
    shuffled batch (threads and groups of four differ)."""
    gen = torch.Generator().manual_seed(7)
    n_rows, n_keys = 160, 512
    sigma = torch.tensor([0.5, 1.0, 2.0, 4.0]).repeat(n_rows // 4).unsqueeze(-1)
    scores = torch.randn(n_rows, n_keys, generator=gen) * sigma
    lengths = torch.randint(40, n_keys + 1, (n_rows,), generator=gen)
    scores = scores.masked_fill(torch.arange(n_keys) >= lengths.unsqueeze(-1), -torch.inf)
    batch = torch.softmax(scores, -1)
    assert batch.numel() >= PARALLEL_MIN_ELEMENTS > n_keys
    cert = certify(batch)
    assert (cert.method == ThetaMethod.FIRST_FIT_ONE_TARGET).sum() > n_rows // 4  # the stage under test runs
    order = torch.randperm(n_rows, generator=gen)
    shuffled = certify(batch[order])
    singles = [certify(row) for row in batch]
    for name in ("lower", "upper", "method"):
        mine = getattr(cert, name)
        assert torch.equal(getattr(shuffled, name), mine[order])
        assert torch.equal(torch.stack([getattr(single, name) for single in singles]), mine)
