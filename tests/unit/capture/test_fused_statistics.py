"""The one-pass row statistics of float32 CPU rows against the general path (certify, then the moments kernel):
the same numbers bit for bit, the same errors."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

import attnsens.capture.statistics as statistics
from attnsens.capture.statistics import RowStats, row_statistics
from attnsens.errors import ConfigError, InputError
from tests.helpers.fused_statistics import general_path
from tests.unit.theta.rows import softmax_rows, with_zeros

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "tiny_gpt_early_rows.npz"


def assert_identical(ours: RowStats, theirs: RowStats) -> None:
    for field in fields(RowStats):
        a, b = getattr(ours, field.name), getattr(theirs, field.name)
        assert a.shape == b.shape and a.dtype == b.dtype, field.name
        if a.dtype.is_floating_point:
            assert torch.equal(a.view(torch.int64), b.view(torch.int64)), field.name  # the same bits
        else:
            assert torch.equal(a, b), field.name


def real_rows() -> torch.Tensor:
    return torch.from_numpy(np.load(FIXTURE)["rows"])


@pytest.mark.parametrize("shape", [(2, 20), (5, 49)], ids=["one thread", "thread pool"])
def test_real_rows_give_the_general_path_bit_for_bit(shape: tuple[int, int]) -> None:
    """The tiny GPT's early-training rows that were hardest for the cascade (every stage of it runs)."""
    probs = real_rows()
    chunk = probs[: shape[0] * shape[1]].reshape(*shape, probs.shape[-1])
    assert_identical(row_statistics(chunk), general_path(chunk))


def test_exact_support_gives_the_general_path_bit_for_bit() -> None:
    """Rows of up to 40 keys all proved exact, on both paths alike; the default leaves some of them open."""
    probs = real_rows()
    probs = probs[(probs > 0).sum(-1) <= 40][:96].reshape(2, 48, probs.shape[-1])
    ours = row_statistics(probs, exact_support=40)
    assert bool(ours.theta_exact.all()) and not bool(row_statistics(probs).theta_exact.all())
    assert_identical(ours, general_path(probs, exact_support=40))
    with pytest.raises(ConfigError, match="exact_support"):
        row_statistics(probs, exact_support=64)


def test_long_causal_rows_give_the_general_path_bit_for_bit() -> None:
    rows = softmax_rows(256, 1024, 2.0, seed=9)
    rows = torch.softmax(
        torch.log(rows).masked_fill(torch.arange(1024) > 4 * torch.arange(256)[:, None], -torch.inf), -1
    )
    assert_identical(row_statistics(rows.reshape(4, 64, 1024)), general_path(rows.reshape(4, 64, 1024)))


@pytest.mark.parametrize("block", [1, 3, 8, 64, 1000])
def test_any_block_of_rows_gives_the_same_bits(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows a block holds (``statistics_block_rows``) change no result: the hardest real rows and long causal
    rows, in blocks of 1, 3, 8 and 64 rows, against the default for their width. A block asked larger than the
    cascade's scratch arrays (``ROW_BLOCK``) is cut to them."""
    from attnsens.capture import _numba_row_statistics as kernels

    hard = real_rows()[:150].reshape(3, 50, -1)
    rows = softmax_rows(192, 1024, 2.0, seed=11)
    causal = torch.softmax(
        torch.log(rows).masked_fill(torch.arange(1024) > 5 * torch.arange(192)[:, None], -torch.inf), -1
    ).reshape(3, 64, 1024)
    expected = [row_statistics(hard), row_statistics(causal)]
    monkeypatch.setattr(kernels, "statistics_block_rows", lambda n_keys: block)
    for probs, theirs in zip((hard, causal), expected, strict=True):
        assert_identical(row_statistics(probs), theirs)


def test_long_rows_take_fewer_rows_a_block() -> None:
    from attnsens.capture._numba_row_statistics import MIN_STATISTICS_BLOCK, statistics_block_rows
    from attnsens.theta._numba_kernels import ROW_BLOCK

    assert statistics_block_rows(128) == statistics_block_rows(2048) == ROW_BLOCK
    assert statistics_block_rows(4096) == 32 and statistics_block_rows(8192) == 16
    assert statistics_block_rows(1 << 20) == MIN_STATISTICS_BLOCK


def test_explicit_key_counts_subnormals_and_masked_keys() -> None:
    rows = with_zeros(softmax_rows(96, 300, 6.0, seed=4), 0.3, seed=5)
    rows[::7] = torch.softmax(torch.linspace(0, 120, 300), 0)  # long tails underflow to subnormals and zeros
    rows[5, 0] = -0.0
    n_keys = torch.full(rows.shape[:-1], 300)
    assert bool(((rows > 0) & (rows < 2.0**-126)).any())
    assert_identical(row_statistics(rows, n_keys=n_keys), general_path(rows, n_keys=n_keys))
    assert_identical(row_statistics(rows), general_path(rows))


def test_invalid_rows_raise_what_certify_raises() -> None:
    rows = softmax_rows(70, 16, 1.0, seed=2)
    rows[40, 3] = float("nan")
    with pytest.raises(InputError) as ours:
        row_statistics(rows)
    with pytest.raises(InputError) as theirs:
        general_path(rows)
    assert str(ours.value) == str(theirs.value)
    rows = softmax_rows(70, 16, 1.0, seed=2) * 1.01  # sums off by 1 %
    with pytest.raises(InputError, match="sum"):
        row_statistics(rows)


def test_other_dtypes_and_empty_batches_take_the_general_path() -> None:
    calls = []
    saved = statistics._fused_row_statistics

    def spy(
        probs: torch.Tensor, n_keys: torch.Tensor | None, exact_support: int | None, logits: torch.Tensor | None
    ) -> RowStats | None:
        result = saved(probs, n_keys, exact_support, logits)
        calls.append(result is not None)
        return result

    statistics._fused_row_statistics = spy
    try:
        row_statistics(softmax_rows(8, 5, 1.0, seed=0, dtype=torch.float64))
        row_statistics(torch.zeros(0, 5))
        row_statistics(softmax_rows(8, 5, 1.0, seed=0))
    finally:
        statistics._fused_row_statistics = saved
    assert calls == [False, False, True]
