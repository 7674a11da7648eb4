"""The entropy of softmax rows from their logits (docs/math.md §2.4, "Entropy from the logits"): log Z · Σp − Σ p s
with log Z = s_a − log p_a, against −Σ p log p of the stored values taken with math.fsum."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from attnsens.capture.statistics import RowStats, row_statistics
from attnsens.errors import ShapeError
from attnsens.models.attention import RowWorkspace
from tests.helpers.fused_statistics import general_path

FLOAT32_ULP = 2.0**-24
ROUNDING = 8 * FLOAT32_ULP
"""The softmax's relative rounding of a stored float32 value, generously: its exponential, sum and division each
within a few ulps. The two entropies are within 2·max|ε|·Σp of each other (docs/math.md §2.4)."""


def oracle_entropy(row: torch.Tensor) -> float:
    """−Σ p log p over the row's positive stored values, summed exactly rounded."""
    return -math.fsum(v * math.log(v) for v in row.double().tolist() if v > 0)


def logit_rows(seed: int) -> torch.Tensor:
    """Float32 logits of every kind the audit meets: spread from near-uniform to one dominant key, long and short
    rows, masked keys (−∞), keys that underflow to exact zeros, subnormal values, large offsets."""
    generator = torch.Generator().manual_seed(seed)
    n = 300
    rows = []
    for scale in (0.01, 0.3, 1.0, 3.0, 10.0, 40.0):
        for offset in (0.0, -70.0, 250.0):
            rows.append(torch.randn(6, n, generator=generator) * scale + offset)
    logits = torch.cat(rows)
    support = torch.randint(1, n + 1, (logits.shape[0],), generator=generator)
    logits[torch.arange(n) >= support[:, None]] = float("-inf")  # causal-like rows of 1..n keys
    logits[::7, 5] = logits[::7, 0] - 95.0  # p ≈ e^-95: a subnormal float32 value
    logits[::11, 3] = logits[::11, 0] - 200.0  # underflows to an exact zero
    return logits


def test_entropy_from_logits_agrees_with_the_stored_values_within_their_rounding() -> None:
    logits = logit_rows(0)
    probs = torch.softmax(logits, dim=-1)
    assert bool((probs[::7, 5] > 0).any()) and bool((probs[::11, 3] == 0).all())
    stats = row_statistics(probs, logits=logits)
    for i in range(probs.shape[0]):
        expected = oracle_entropy(probs[i])
        margin = 2 * ROUNDING * float(stats.row_sum[i]) + 1e-13
        assert abs(float(stats.entropy[i]) - expected) <= margin, (i, float(stats.entropy[i]), expected)
    assert bool((stats.entropy >= 0).all())


def test_logits_of_any_scale_give_the_entropy_of_the_values() -> None:
    """Logits near ±10^12 (float32 steps of 2^16 there, so a row of them is uniform over its keys, or as good as
    one key) and near 10^2: the sums are taken relative to a logit of the row, so log Z · Σp and Σ p s, each about
    10^12, do not cancel to rounding noise (float64 steps of 1.2·10^-4 there)."""
    steps = torch.tensor([0.0, 0.0, 0.0, -1.0, 0.0, -1.0, 0.0] * 40)
    logits = torch.stack([1e12 + 0 * steps, -3e11 + 0 * steps, 123.0 + steps])
    probs = torch.softmax(logits, dim=-1)
    stats = row_statistics(probs, logits=logits)
    general = general_path(probs, logits=logits)
    for i in range(3):
        expected = oracle_entropy(probs[i])
        margin = 2 * ROUNDING * float(stats.row_sum[i]) + 1e-13
        assert abs(float(stats.entropy[i]) - expected) <= margin, (i, float(stats.entropy[i]), expected)
        assert abs(float(general.entropy[i]) - expected) <= margin, (i, float(general.entropy[i]), expected)


def test_the_margin_catches_a_wrong_normaliser() -> None:
    """Meta-test: log Z taken as s_a (as if p_a were 1) falls outside the margin on every row whose largest entry
    is not about 1, and the entropy in bits on every row of some entropy, so the comparison above can fail."""
    logits = logit_rows(1)
    probs = torch.softmax(logits, dim=-1)
    stats = row_statistics(probs, logits=logits)
    p, s = probs.double(), logits.double()
    at = stats.argmax.unsqueeze(-1)
    cross = torch.where(probs > 0, p * s, 0.0).sum(-1)
    wrong_log_z = s.gather(-1, at).squeeze(-1) * stats.row_sum - cross
    expected = torch.tensor([oracle_entropy(row) for row in probs], dtype=torch.float64)
    margin = 2 * ROUNDING * stats.row_sum + 1e-13
    spread = stats.p_max < 0.999  # a row with p_a ≈ 1 has log p_a ≈ 0 and cannot tell
    assert int(spread.sum()) > probs.shape[0] // 2
    assert bool(((wrong_log_z - expected).abs() > margin)[spread].all())
    assert bool(((stats.entropy / math.log(2) - expected).abs() > margin)[expected > 1e-3].all())


def test_logits_change_only_the_entropy() -> None:
    logits = logit_rows(2)
    probs = torch.softmax(logits, dim=-1)
    plain, from_logits = row_statistics(probs), row_statistics(probs, logits=logits)
    for field in fields(RowStats):
        if field.name in ("entropy", "normalized_entropy"):
            continue
        assert torch.equal(getattr(plain, field.name), getattr(from_logits, field.name)), field.name


def test_a_one_key_row_has_zero_entropy_and_a_uniform_row_log_n() -> None:
    logits = torch.full((2, 8), float("-inf"))
    logits[0, 2] = 41.5  # one key: p = 1 exactly
    logits[1, :] = 3.0  # uniform over 8 keys
    stats = row_statistics(torch.softmax(logits, dim=-1), logits=logits)
    assert float(stats.entropy[0]) == 0.0
    assert math.isclose(float(stats.entropy[1]), math.log(8), rel_tol=1e-7)


def test_the_torch_path_computes_the_same_entropy() -> None:
    """Rows off the one-pass kernel (here: with it switched off) take the same formula in torch operations."""
    logits = logit_rows(3)
    probs = torch.softmax(logits, dim=-1)
    fused = row_statistics(probs, logits=logits)
    general = general_path(probs, logits=logits)
    torch.testing.assert_close(general.entropy, fused.entropy, rtol=0, atol=1e-12)
    torch.testing.assert_close(general.normalized_entropy, fused.normalized_entropy, rtol=0, atol=1e-12)


def test_rows_off_the_cpu_kernel_take_no_logarithm_a_key_with_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 rows (as GPU rows are) take the torch operations: with logits their entropy is the logits' formula
    alone, within the rows' rounding of −Σ p log p, and the elementwise −p log p pass is not run at all."""
    logits = logit_rows(5).double()
    probs = torch.softmax(logits, dim=-1)
    plain = row_statistics(probs)

    def no_xlogy(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("−Σ p log p computed although the logits give the entropy")

    monkeypatch.setattr(torch.special, "xlogy", no_xlogy)
    with_logits = row_statistics(probs, logits=logits)
    torch.testing.assert_close(with_logits.entropy, plain.entropy, rtol=1e-12, atol=1e-12)
    for name in ("p_max", "argmax", "row_sum", "n_eff", "theta_lower", "theta_upper"):
        assert torch.equal(getattr(with_logits, name), getattr(plain, name)), name


def test_logits_of_another_shape_are_refused() -> None:
    probs = torch.softmax(torch.randn(4, 10), dim=-1)
    with pytest.raises(ShapeError, match="logits"):
        row_statistics(probs, logits=torch.randn(4, 9))


def test_the_workspace_hands_out_the_logits_of_its_latest_rows_only() -> None:
    workspace = RowWorkspace(64)
    first = workspace.views((2, 3, 4), torch.device("cpu"))
    assert first is not None
    scores, probs = first
    assert workspace.logits_of(probs) is scores
    assert workspace.logits_of(probs.clone()) is None  # a tensor of its own
    assert workspace.logits_of(probs[:1]) is None  # part of the rows
    second = workspace.views((3, 4), torch.device("cpu"))
    assert second is not None
    assert workspace.logits_of(probs) is None  # overwritten by a later chunk
    assert workspace.logits_of(second[1]) is second[0]
