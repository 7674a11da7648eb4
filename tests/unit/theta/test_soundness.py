"""Soundness (lower ≤ θ ≤ upper, exactly, for the real θ of the stored values) and the exact-flag claim."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from attnsens.theta import ThetaMethod, certify
from attnsens.theta._numba_first_fit import BINADES, _binade_first_fit
from tests.helpers.soundness import BACKENDS, assert_certificate_sound, assert_exact_width
from tests.reference.theta_oracles import theta_fraction
from tests.unit.theta.rows import adversarial_rows, softmax_rows, with_zeros

SIGMAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def check_rows(rows: torch.Tensor, backend: str, precision: str, labels: list[str], tolerance: float = 1e-3) -> None:
    cert = certify(rows, precision=precision, backend=backend, tolerance=tolerance)
    for i, row in enumerate(rows):
        lower, upper = float(cert.lower[i]), float(cert.upper[i])
        label = f"{labels[i]} [{backend}, {precision}]"
        assert_certificate_sound(lower, upper, theta_fraction(row.tolist()), label)
        if bool(cert.exact[i]):
            assert_exact_width(row, lower, upper, label)
        if int((row != 0).sum()) <= 24:
            assert bool(cert.exact[i]), f"{label}: support ≤ 24 must be solved exactly"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_softmax_rows_contain_theta(backend: str, precision: str, dtype: torch.dtype) -> None:
    blocks, labels = [], []
    for j, sigma in enumerate(SIGMAS):
        for length in (1, 2, 3, 7, 13, 16):
            rows = softmax_rows(2, length, sigma, seed=100 * j + length, dtype=dtype)
            if length >= 3:
                rows = with_zeros(rows, 0.3, seed=j + length)
            blocks.append(torch.nn.functional.pad(rows, (0, 16 - length)))
            labels += [f"softmax σ={sigma} L={length}"] * 2
    check_rows(torch.cat(blocks), backend, precision, labels)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adversarial_families_contain_theta(backend: str, dtype: torch.dtype) -> None:
    for length in (5, 16):
        families = adversarial_rows(length, seed=length)
        rows = torch.tensor(list(families.values()), dtype=dtype)
        check_rows(rows, backend, "float32", [f"{name} L={length}" for name in families], tolerance=1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_uniform_rows_long_closed_form(backend: str) -> None:
    """Uniform over k stored atoms v: d* = 0 (k even) or v/2 (k odd), so θ = k·v − (k mod 2)·v², exactly."""
    length = 1021
    rows, thetas = [], []
    for k in (2, 3, 14, 15, 16, 17, 64, 101, 1000, 1021):
        v = torch.tensor(1.0 / k, dtype=torch.float32)
        row = torch.zeros(length, dtype=torch.float32)
        row[torch.randperm(length, generator=torch.Generator().manual_seed(k))[:k]] = v
        rows.append(row)
        fv = Fraction(float(v))
        thetas.append(k * fv - (k % 2) * fv * fv)
    cert = certify(torch.stack(rows), backend=backend)
    for i, theta in enumerate(thetas):
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"uniform row {i}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_dominant_rows_long_closed_form(backend: str) -> None:
    """p_max ≥ s/2 ⇒ θ = s − (2·p_max − s)² (docs/math.md T2(a)), proved and enclosed tightly."""
    tail = softmax_rows(6, 300, 1.0, seed=3, dtype=torch.float64)
    heavy = torch.tensor([0.5, 0.5 + 1e-7, 0.6, 0.8, 0.95, 0.999], dtype=torch.float64)
    rows = torch.cat([heavy.unsqueeze(-1), tail * (1 - heavy).unsqueeze(-1)], dim=-1)
    cert = certify(rows, backend=backend)
    for i, row in enumerate(rows):
        s = sum(Fraction(v) for v in row.tolist())
        theta = s - (2 * Fraction(float(row[0])) - s) ** 2
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"dominant row {i}")
        if i > 0:
            assert bool(cert.exact[i]) and int(cert.method[i]) == ThetaMethod.DOMINANT_ATOM
            assert_exact_width(row, float(cert.lower[i]), float(cert.upper[i]), f"dominant row {i}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_planted_perfect_partition_long_rows(backend: str) -> None:
    """Dyadic rows made of equal pairs: d* = 0 and θ = s exactly; the upper bound must not fall below s."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for _ in range(8):
        half = torch.randint(1, 2**20, (200,), generator=gen).to(torch.float64)
        ints = torch.cat([half, half])[torch.randperm(400, generator=gen)]
        rows.append(ints / 2.0 ** torch.ceil(torch.log2(ints.sum())))
    rows = torch.stack(rows)
    cert = certify(rows, backend=backend, tolerance=1.0)
    for i, row in enumerate(rows):
        s = sum(Fraction(v) for v in row.tolist())
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), s, f"planted row {i}")


def test_meta_oracle_catches_a_wrong_kernel() -> None:
    """The soundness check fails for a kernel that measures distances to 1/2 instead of s/2."""
    row = torch.tensor([0.3006, 0.3, 0.2, 0.2], dtype=torch.float64)
    s = row.sum()
    sums = torch.tensor([0.0, 0.3006, 0.3, 0.6006, 0.2, 0.5006, 0.5, 0.8006, 0.2, 0.5006, 0.5, 0.8006, 0.4, 0.7006,
                         0.7, 1.0006], dtype=torch.float64)  # fmt: skip
    wrong = float(s - 4.0 * (sums - 0.5).abs().min() ** 2)
    with pytest.raises(AssertionError):
        assert_certificate_sound(wrong, wrong, theta_fraction(row.tolist()), "wrong kernel")


def test_meta_oracle_catches_a_wrong_exact_claim() -> None:
    """A prefix-at-½ subset presented as exact is caught by the exact rational θ on a short row."""
    row = [0.4, 0.3, 0.2, 0.1]
    prefix = 0.0
    for v in row:
        if prefix + v >= 0.5:
            d = min(0.5 - prefix, prefix + v - 0.5)
            break
        prefix += v
    claimed = 1.0 - 4.0 * d**2
    with pytest.raises(AssertionError):
        assert_certificate_sound(claimed, claimed, theta_fraction(row), "prefix claimed exact")


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_sum_above_one_allows_negative_theta(backend: str) -> None:
    """A single atom of mass s > 1 has θ = s − s² < 0; the interval must not be clamped at 0."""
    row = torch.tensor([1.0005], dtype=torch.float64)
    cert = certify(row, backend=backend)
    assert_certificate_sound(float(cert.lower), float(cert.upper), theta_fraction(row.tolist()), "single atom s>1")
    assert float(cert.upper) < 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_relaxation_gap_within_rounding_radius_keeps_a_useful_lower_bound(backend: str) -> None:
    """0 < d_lb ≤ E leaves no top-8 target; the fill must be skipped, not run against a target of −1."""
    row = torch.tensor([0.51 + 2e-15, 0.3, 0.2] + [0.01 / 27] * 27, dtype=torch.float64)
    values = [Fraction(v) for v in row.tolist()]
    s = sum(values)
    assert 2 * values[0] >= s  # a dominant atom by a margin below the rounding radius: θ = s − (2·p_max − s)²
    theta = s - (2 * values[0] - s) ** 2
    cert = certify(row, backend=backend, tolerance=1.0)
    assert_certificate_sound(float(cert.lower), float(cert.upper), theta, "d_lb ≤ E row")
    assert float(cert.lower) > 1.0


def test_top14_endpoint_is_not_labelled_exact() -> None:
    assert not ThetaMethod.TOP14_ENDPOINT.is_exact
    assert ThetaMethod.K_ATOM_RELAXATION_14.is_exact


@pytest.mark.parametrize("backend", BACKENDS)
def test_perfect_bisection_certifies_theta_equal_to_the_row_sum(backend: str) -> None:
    """d* = 0 with error-free sums leaves nothing to round: lower == upper == s (p = (½, ½) gives θ = 1)."""
    rows = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.375, 0.125, 0.25, 0.25]])
    cert = certify(rows, backend=backend)
    assert cert.exact.all()
    torch.testing.assert_close(cert.lower, torch.ones(3, dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(cert.upper, torch.ones(3, dtype=torch.float64), rtol=0, atol=0)


def half_quantum_rows(pairs: tuple[int, ...], high: int, seed: int) -> tuple[torch.Tensor, list[Fraction]]:
    """Rows of equal pairs of integers in [1, high) plus one key of 1, scaled by the power of two q that brings the
    sum into (1/2, 1]: every split is an odd number of q/2 from s/2, and q/2 is attained (θ = s − q²)."""
    gen = torch.Generator().manual_seed(seed)
    scaled = [scaled_row(shuffled_pairs(torch.randint(1, high, (n,), generator=gen), gen), 1001) for n in pairs]
    return torch.stack([row for row, _ in scaled]), [q for _, q in scaled]


def shuffled_pairs(half: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Two copies of each value of ``half`` and one key of 1, in random key order (float64 integers)."""
    ints = torch.cat([half.to(torch.float64), half.to(torch.float64), torch.ones(1, dtype=torch.float64)])
    return ints[torch.randperm(ints.numel(), generator=gen)]


def scaled_row(ints: torch.Tensor, width: int) -> tuple[torch.Tensor, Fraction]:
    """Integers scaled by the power of two q that brings their sum into (1/2, 1], padded with zeros to ``width``
    keys, and q."""
    scale = 2.0 ** -float(torch.ceil(torch.log2(ints.sum())))
    return torch.nn.functional.pad(ints * scale, (0, width - ints.numel())), Fraction(scale)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_planted_half_quantum_split_long_rows(backend: str, dtype: torch.dtype) -> None:
    """Equal pairs plus one key of one quantum q: the total is odd in units of q, so every split is at least q/2
    from s/2, and splitting each pair with the extra key on one side attains it: θ = s − q² exactly. Long
    near-uniform rows like these settle in the first first-fit passes (whole row into s/2, then the top-8
    target), which must report a real subset's distance and no lower bound beyond parity. In the coarse rows
    q/2 ≥ 2^-13 exceeds the float32 stop distance 2^-13.5, so a first-fit can end them only with a perfect
    split (2d ≤ q): any distance it miscomputes below q/2 is claimed exact and caught."""
    fine, fine_q = half_quantum_rows((25, 40, 63, 150, 500) * 3, 2**12, seed=11)
    coarse, coarse_q = half_quantum_rows((25, 40, 63, 150, 300, 500) * 2, 4, seed=12)
    batch = torch.cat([fine, coarse]).to(dtype)
    quanta = fine_q + coarse_q
    assert all(q / 2 > Fraction(2.0**-13.5) for q in coarse_q)
    cert = certify(batch, backend=backend, tolerance=1.0)
    first_fit = (ThetaMethod.FIRST_FIT_ONE_TARGET, ThetaMethod.FIRST_FIT_SIXTEEN_TARGETS)
    assert sum(int(m) in first_fit for m in cert.method[: len(fine)]) >= 5  # the stages under test settle rows
    for i, row in enumerate(batch):
        s = sum(Fraction(v) for v in row.tolist())
        theta = s - quanta[i] ** 2
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"half-quantum row {i}")


def sink_half_quantum_rows(sizes: tuple[int, ...], high: int, seed: int) -> tuple[torch.Tensor, list[Fraction]]:
    """Half-quantum rows (``half_quantum_rows``) led by a large pair like an attention sink: one copy at key 0, the
    other at the last key, each about 30 % of the row, and the keys between in ascending order. A fill in key order
    takes the first copy, spends the small keys while the total is still far below s/2 and is left with a gap that
    only larger keys follow."""
    gen = torch.Generator().manual_seed(seed)
    rows, quanta = [], []
    for n_pairs in sizes:
        half = torch.randint(1, high, (n_pairs,), generator=gen).to(torch.float64)
        sink = torch.tensor([float(torch.ceil(0.45 * half.sum()))], dtype=torch.float64)
        middle = torch.cat([half, half, torch.ones(1, dtype=torch.float64)])
        row, q = scaled_row(torch.cat([sink, middle.sort().values, sink]), 1003)
        rows.append(row)
        quanta.append(q)
    return torch.stack(rows), quanta


def scattered_half_quantum_rows(sizes: tuple[int, ...], seed: int) -> tuple[torch.Tensor, list[Fraction]]:
    """Half-quantum rows (``half_quantum_rows``) shaped like the long attention rows that neither whole-row fill
    settles: of each pair's first copies, four are large (2^19–2^20), six medium (1/128–1/4 of those) and the rest
    small (1–127), all in random key order. Both fills, in key order and back from the last key, spend small keys
    before they reach s/2 and are left with a gap that only large keys follow; the fill by binade is not."""
    gen = torch.Generator().manual_seed(seed)
    rows, quanta = [], []
    for n_pairs in sizes:
        u = torch.rand(n_pairs, generator=gen, dtype=torch.float64)
        exponent = torch.cat([19.0 + u[:4], 13.0 + 5.0 * u[4:10]])
        small = torch.randint(1, 2**7, (n_pairs - 10,), generator=gen).to(torch.float64)
        row, q = scaled_row(shuffled_pairs(torch.cat([torch.floor(2.0**exponent), small]), gen), 1003)
        rows.append(row)
        quanta.append(q)
    return torch.stack(rows), quanta


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_planted_half_quantum_split_sink_rows(dtype: torch.dtype) -> None:
    """Sink-led half-quantum rows (θ = s − q² exactly) that the key-order fill leaves open: the fill back from the
    last key (and the fill by binade after it) settles them, and must report the distance of a real subset. In the
    coarse rows q/2 exceeds the stop distance, so a fill can end them only with a claimed perfect split: a key
    counted twice or a block added without fitting claims a distance below q/2 and is caught."""
    fine, fine_q = sink_half_quantum_rows((80, 150, 300, 500) * 4, 2**12, seed=21)
    coarse, coarse_q = sink_half_quantum_rows((80, 150, 250) * 4, 4, seed=22)
    assert all(q / 2 > Fraction(2.0**-13.5) for q in coarse_q)
    batch = torch.cat([fine, coarse]).to(dtype)
    quanta = fine_q + coarse_q
    cert = certify(batch, tolerance=1.0)
    fills = (ThetaMethod.FIRST_FIT_ONE_TARGET, ThetaMethod.FIRST_FIT_BINADES)
    assert sum(ThetaMethod(int(m)) in fills for m in cert.method[: len(fine)]) >= 8  # the stages under test settle rows
    for i, row in enumerate(batch):
        s = sum(Fraction(v) for v in row.tolist())
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), s - quanta[i] ** 2, f"sink row {i}")
    assert float(cert.width[: len(fine)].max()) <= 2.0**-25  # and each fine row's subset is as close as it says


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_planted_half_quantum_split_binade_first_fit(dtype: torch.dtype) -> None:
    """Scattered half-quantum rows (θ = s − q² exactly) that both whole-row fills leave open: the binade first-fit
    settles them (its own method code shows it ran), and must report the distance of a real subset. A binade
    added whole when it overshoots reports a subset beyond s/2 as within the stop distance, which leaves the
    interval wider than 2^-25 or below θ."""
    rows, quanta = scattered_half_quantum_rows((80, 150, 300, 500) * 4, seed=21)
    batch = rows.to(dtype)
    cert = certify(batch, tolerance=1.0)
    methods = [ThetaMethod(int(m)) for m in cert.method]
    assert methods.count(ThetaMethod.FIRST_FIT_BINADES) >= 4, methods  # the stage under test settles rows
    for i, row in enumerate(batch):
        s = sum(Fraction(v) for v in row.tolist())
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), s - quanta[i] ** 2, f"scattered row {i}")
    assert float(cert.width.max()) <= 2.0**-25


@pytest.mark.parametrize("high", [2**12, 4])
def test_binade_first_fit_reports_a_real_subset(high: int) -> None:
    """The binade first-fit on its own, on the sink-led half-quantum rows: every split is an odd number of q/2 from
    s/2 and the sums are exact, so its distance must be at least q/2 (a binade added whole without fitting, or a
    key counted twice, gives less), and on the rows of many small keys within the stop distance."""
    rows, quanta = sink_half_quantum_rows((80, 150, 300, 500) * 2, high, seed=23)
    x = rows.to(torch.float32).numpy()
    bits = x.view(np.int32)
    counts, masses, grouped = np.empty(4 * BINADES, np.int64), np.empty(4 * BINADES), np.empty(x.shape[1])
    for i, q in enumerate(quanta):
        end = int(np.flatnonzero(x[i])[-1]) + 1
        t = 0.5 * float(x[i].astype(np.float64).sum())
        top = math.frexp(float(x[i].max()))[1] - 1 + 127
        d = _binade_first_fit(x[i], bits[i], end, t, 2.0**-13.5, 23, 127, top, counts, masses, grouped)
        assert Fraction(d) >= q / 2, f"row {i}: d = {d!r} below q/2 = {float(q / 2)!r}"
        if high > 4:
            assert d <= 2.0**-13.5, f"row {i}: d = {d!r}"
