"""row_statistics: closed forms, agreement with a float64 oracle, and soundness of the θ interval."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnsens.capture import row_statistics
from tests.reference.model_oracles import row_statistics_plain


def test_closed_forms_half_half_uniform_and_single_key() -> None:
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0], [0.2] * 5, [1.0, 0.0, 0.0, 0.0, 0.0]])
    stats = row_statistics(probs)
    torch.testing.assert_close(stats.entropy, torch.tensor([math.log(2), math.log(5), 0.0], dtype=torch.float64))
    torch.testing.assert_close(stats.normalized_entropy, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(stats.n_eff, torch.tensor([2.0, 5.0, 1.0], dtype=torch.float64))
    assert stats.n_keys.tolist() == [2, 5, 1]
    assert stats.dominant.tolist() == [True, False, True]
    assert stats.argmax.tolist()[2] == 0
    # p = (½, ½): θ = 1; the certificate rounds outward, so allow one ulp-scale gap below 1.
    assert 1.0 - 1e-12 <= float(stats.theta_lower[0]) <= 1.0 <= float(stats.theta_upper[0])
    assert float(stats.theta_upper[2]) <= 1e-12  # a point mass cannot be balanced


def test_explicit_n_keys_counts_underflowed_keys() -> None:
    """A causal row whose allowed keys underflow to zero still has n_keys = t + 1."""
    probs = torch.tensor([[1.0, 0.0, 0.0]])
    stats = row_statistics(probs, n_keys=torch.tensor([3]))
    assert stats.n_keys.tolist() == [3]
    assert float(stats.normalized_entropy[0]) == 0.0


def _rows(draw_rows: list[list[float]]) -> torch.Tensor:
    probs = torch.tensor(draw_rows, dtype=torch.float64)
    return (probs / probs.sum(dim=-1, keepdim=True)).to(torch.float32)


@given(
    st.lists(
        st.lists(st.floats(min_value=0.0, max_value=1.0, allow_subnormal=False), min_size=11, max_size=11).filter(
            lambda r: sum(r) > 0.1
        ),
        min_size=1,
        max_size=7,
    )
)
def test_matches_the_float64_oracle_and_theta_is_bracketed(raw: list[list[float]]) -> None:
    probs = _rows(raw)
    stats = row_statistics(probs)
    for i, row in enumerate(probs.double().tolist()):
        expected = row_statistics_plain(row, n_keys=sum(v > 0 for v in row))
        assert math.isclose(float(stats.p_max[i]), expected["p_max"], rel_tol=1e-12)
        assert float(stats.p_max[i]) == row[int(stats.argmax[i])]
        assert math.isclose(float(stats.entropy[i]), expected["entropy"], rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(float(stats.normalized_entropy[i]), expected["normalized_entropy"], abs_tol=1e-9)
        assert math.isclose(float(stats.n_eff[i]), expected["n_eff"], rel_tol=1e-9)
        assert math.isclose(float(stats.row_sum[i]), expected["row_sum"], rel_tol=1e-12)
        assert bool(stats.dominant[i]) == expected["dominant"]
        assert float(stats.theta_lower[i]) <= expected["theta"] + 1e-12 <= float(stats.theta_upper[i]) + 2e-12


def test_oracle_catches_a_wrong_entropy_base() -> None:
    """Meta-test: entropy in bits instead of nats differs from the oracle."""
    row = [0.25, 0.25, 0.5]
    wrong_bits = -sum(v * math.log2(v) for v in row)
    assert not math.isclose(wrong_bits, row_statistics_plain(row, 3)["entropy"], rel_tol=1e-6)
    assert math.isclose(row_statistics_plain([0.5, 0.5], 2)["theta"], 1.0)


def test_leading_shape_is_kept() -> None:
    probs = torch.softmax(torch.randn(2, 3, 5, 7), dim=-1)
    stats = row_statistics(probs)
    assert stats.theta_lower.shape == stats.p_max.shape == stats.n_keys.shape == (2, 3, 5)
    assert stats.flatten().entropy.shape == (30,)


def test_moments_of_subnormal_zero_and_negative_zero_entries_match_the_oracle() -> None:
    """The vectorised moments pass: subnormal values (their second, math.log pass), ±0.0 (masked keys) and long
    rows, against math.fsum and math.log."""
    rows = torch.zeros(6, 300, dtype=torch.float32)
    rows[0, :3] = torch.tensor([0.5, 0.25, 0.25])
    rows[1, 0], rows[1, 5], rows[1, 6] = 1.0, 2.0**-140, 2.0**-149  # subnormal float32 values
    rows[2] = torch.softmax(torch.randn(300, generator=torch.Generator().manual_seed(1)), dim=0)
    rows[3, 10], rows[3, 11] = -0.0, 1.0
    # The pass stops at the last entry that is not ±0.0: keys after long runs of zeros still count.
    rows[4, 0], rows[4, 200], rows[4, 299] = 0.5, 0.25, 0.25
    rows[5, 0], rows[5, 150], rows[5, 250] = 1.0, 2.0**-149, -0.0
    stats = row_statistics(rows)
    for i, row in enumerate(rows.double().tolist()):
        support = [v for v in row if v > 0]
        entropy = -math.fsum(v * math.log(v) for v in support)
        assert math.isclose(float(stats.entropy[i]), entropy, rel_tol=1e-14, abs_tol=1e-300)
        assert math.isclose(float(stats.row_sum[i]), math.fsum(support), rel_tol=1e-14)
        assert math.isclose(1.0 / float(stats.n_eff[i]), math.fsum(v * v for v in support), rel_tol=1e-14)
        assert float(stats.p_max[i]) == max(row) and int(stats.argmax[i]) == row.index(max(row))
        assert int(stats.n_keys[i]) == len(support)
    assert float(stats.entropy[1]) > 0.0  # only the subnormal keys carry entropy


def test_the_moments_logarithm_is_within_one_ulp_of_the_c_library() -> None:
    import numpy as np

    from attnsens.capture._numba_moments import _log

    generator = np.random.default_rng(0)
    bits = generator.integers(0x00800000, 0x7F800000, size=20_000, dtype=np.int64).astype(np.int32)
    grid = np.float32(np.linspace(0.5, 2.0, 5_001)).view(np.int32)  # around 1, where log is smallest
    for b in np.concatenate([bits, grid, np.float32([1.0, 2.0**-126, 1.4142135, 1.4142137, 3e38]).view(np.int32)]):
        value = float(np.int32(b).view(np.float32))
        expected = math.log(value)
        assert abs(_log(b) - expected) <= math.ulp(expected), value
