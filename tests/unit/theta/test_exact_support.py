"""``certify(p, exact_support=N)``: every row of at most N non-zeros proved exact, longer rows at the precision
asked; and the enumeration's reused buffers, which must never leak one row's sums into the next.

Exact values are checked against the integer meet-in-the-middle oracle (rows of up to 36 keys) and, for longer
rows, against an independent local search (a real subset: θ can only be larger).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from attnsens.errors import ConfigError, InputError
from attnsens.theta import certify
from attnsens.theta._numba_enumeration import mitm_workspace
from attnsens.theta._numba_partition import meet_in_the_middle
from attnsens.theta.certificate import EXACT_SUPPORT_MAX, MITM_MAX_SUPPORT
from tests.helpers.cardinality import local_search_theta
from tests.helpers.real_rows import (
    ORACLE_MAX_SUPPORT,
    assert_enumerated_rows_equal_the_oracle,
    dyadic,
    oracle_rows,
    support,
)
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "tiny_gpt_early_rows.npz"


@pytest.fixture(scope="module")
def real_rows() -> torch.Tensor:
    return torch.from_numpy(np.load(FIXTURE)["rows"])


def test_default_leaves_real_short_rows_open(real_rows: torch.Tensor) -> None:
    """The premise of the option: by default some real rows of 27–40 keys end at float32 resolution unproved."""
    n = support(real_rows)
    cert = certify(real_rows[(n >= 27) & (n <= 40)])
    assert not bool(cert.exact.all())
    assert float(cert.width.max()) <= 2.0**-25


def test_every_real_row_up_to_the_support_is_exact_and_equals_the_oracle(real_rows: torch.Tensor) -> None:
    rows = oracle_rows(real_rows)
    assert_enumerated_rows_equal_the_oracle(rows, certify(rows, exact_support=ORACLE_MAX_SUPPORT))


def test_rows_of_37_to_48_keys_are_exact_and_no_real_subset_beats_them(real_rows: torch.Tensor) -> None:
    n = support(real_rows)
    rows = real_rows[(n > ORACLE_MAX_SUPPORT) & (n <= EXACT_SUPPORT_MAX)][::2]
    assert rows.shape[0] >= 20
    cert = certify(rows, exact_support=EXACT_SUPPORT_MAX)
    assert bool(cert.exact.all()), cert.method_names()
    default = certify(rows)
    assert bool(((cert.lower >= default.lower) & (cert.upper <= default.upper)).all())
    rng = np.random.default_rng(0)
    for i, row in enumerate(rows):
        found = local_search_theta(row.tolist(), rng)  # θ of a real subset: θ ≥ found
        assert Fraction(float(cert.upper[i])) >= found, f"row {i}: upper {float(cert.upper[i])!r} < {float(found)!r}"


def test_longer_rows_keep_the_precision_asked(real_rows: torch.Tensor) -> None:
    n = support(real_rows)
    rows = real_rows[(n >= 33) & (n <= 63)]
    cert = certify(rows, exact_support=40)
    assert bool(cert.exact[support(rows) <= 40].all())
    assert float(cert.width.max()) <= 2.0**-25


def test_torch_backend_enumerates_up_to_the_support(real_rows: torch.Tensor) -> None:
    n = support(real_rows)
    rows = real_rows[(n >= 25) & (n <= 30)]
    cert = certify(rows, exact_support=30, backend="torch")
    assert bool(cert.exact.all())
    reference = certify(rows, exact_support=30, backend="numba")
    assert bool(((cert.lower <= reference.upper) & (reference.lower <= cert.upper)).all())


@pytest.mark.parametrize("value", [MITM_MAX_SUPPORT - 1, EXACT_SUPPORT_MAX + 1, 0, -5, 30.0, True, "48"])
def test_support_outside_the_range_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="exact_support"):
        certify(torch.tensor([0.5, 0.5]), exact_support=value)  # type: ignore[arg-type]


def test_a_reused_workspace_gives_each_row_its_own_optimum() -> None:
    """A longer row enumerated first leaves its sums in the buffers; the next, shorter rows must not see them.
    The check fails on a version that sweeps the whole buffer instead of the row's own 2^m sums."""
    rng = np.random.default_rng(1)
    rows = []
    for n in (34, 26, 31, 20, 33):
        row = rng.random(n).astype(np.float32) + np.float32(0.5)
        rows.append((row / row.sum(dtype=np.float32)).astype(np.float32))
    shared = mitm_workspace(34)
    for row in rows:
        t = 0.5 * float(row.astype(np.float64).sum())
        fresh = meet_in_the_middle(row, row.size, t, 0.0, np.inf, mitm_workspace(0))
        reused = meet_in_the_middle(row, row.size, t, 0.0, np.inf, shared)
        assert reused == fresh
        if row.size <= 26:
            theta = theta_dyadic_meet_in_the_middle(*dyadic(torch.from_numpy(row)))
            s = Fraction(sum(Fraction(float(v)) for v in row))
            assert Fraction(fresh) ** 2 * 4 == s - theta


def test_held_workspaces_are_shared_within_the_block_and_released_after() -> None:
    from attnsens.theta._numba_kernels import holding_workspaces, thread_workspaces

    assert thread_workspaces(48, 40, 2).shape == (2, 4, 1 << 20)  # sized by the longest possible row
    assert thread_workspaces(24, 1024, 2).shape == (2, 4, 0)  # the default enumerates only a few sums
    with holding_workspaces():
        held = thread_workspaces(40, 512, 2)
        assert thread_workspaces(40, 512, 2) is held
    assert thread_workspaces(40, 512, 2) is not held


def test_enumeration_runs_on_fewer_threads_where_every_thread_s_workspace_would_not_fit(
    real_rows: torch.Tensor, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each thread of an ``exact_support`` call holds a workspace of 2^⌈N/2⌉ × 32 bytes (0.5 GiB at 48). On a
    machine whose memory holds fewer threads' workspaces than there are threads, fewer run, with a note, and the
    certificate is the one all threads give."""
    import numba

    from attnsens.theta import _numba_kernels as kernels
    from attnsens.theta import certificate

    if numba.get_num_threads() < 2:
        pytest.skip("needs numba's pool of at least two threads")
    n = support(real_rows)
    rows = real_rows[(n >= 25) & (n <= 36)][:96]
    every_thread = certify(rows, exact_support=36)
    per_thread = kernels.workspace_bytes(36, rows.shape[1])
    assert per_thread == 32 << 18
    sized: list[int] = []
    workspaces = kernels.thread_workspaces

    def recording(mitm_max: int, n_keys: int, threads: int) -> np.ndarray:
        sized.append(threads)
        return workspaces(mitm_max, n_keys, threads)

    monkeypatch.setattr(kernels, "thread_workspaces", recording)
    monkeypatch.setattr(certificate, "_NOTED_THREADS", set())
    monkeypatch.setattr(certificate, "physical_memory", lambda: 3 * per_thread)  # half of it holds one workspace
    capsys.readouterr()
    one_thread = certify(rows, exact_support=36)
    assert sized == [1]
    assert "1 of" in capsys.readouterr().err
    for name in ("lower", "upper", "exact", "method"):
        assert torch.equal(getattr(one_thread, name), getattr(every_thread, name)), name
    assert numba.get_num_threads() >= 2  # the pool's size is back after the call
    monkeypatch.setattr(certificate, "physical_memory", lambda: 1 << 50)
    certify(rows, exact_support=36)
    assert sized[-1] == numba.get_num_threads()


def test_calls_sharing_held_workspaces_give_what_separate_calls_give(real_rows: torch.Tensor) -> None:
    """Longer rows first, then shorter ones in the same buffers: nothing of the first call may reach the second."""
    from attnsens.theta._numba_kernels import holding_workspaces

    n = support(real_rows)
    longer, shorter = real_rows[(n >= 37) & (n <= 40)], real_rows[(n >= 25) & (n <= 31)]
    apart = [certify(rows, exact_support=40) for rows in (longer, shorter)]
    with holding_workspaces():
        shared = [certify(rows, exact_support=40) for rows in (longer, shorter)]
    for a, b in zip(apart, shared, strict=True):
        assert torch.equal(a.lower, b.lower) and torch.equal(a.upper, b.upper) and bool(b.exact.all())


def test_progress_reports_blocks_of_rows_and_changes_no_result() -> None:
    """With ``progress`` the rows are certified block by block (here under ``exact_support``, whose workspaces the
    blocks share): the certificate equals the one-call certificate field by field, the calls count up to every
    row, and an invalid row is named by its index in the whole tensor, not in its block."""
    from dataclasses import fields

    from tests.unit.theta.rows import softmax_rows

    p = torch.cat([softmax_rows(300, 40, sigma, seed=7) for sigma in (0.3, 1.0, 3.0)]).reshape(3, 300, 40)
    p[:, ::7, 30:] = 0.0  # short rows of 30 keys among the 40-key ones
    p = p / p.sum(-1, keepdim=True)
    calls: list[tuple[int, int]] = []
    blocked = certify(p, exact_support=40, progress=lambda done, total: calls.append((done, total)))
    whole = certify(p, exact_support=40)
    for field in fields(whole):
        torch.testing.assert_close(getattr(blocked, field.name), getattr(whole, field.name), rtol=0, atol=0)
    assert len(calls) > 5 and calls[-1] == (900, 900)
    assert [done for done, _ in calls] == sorted({done for done, _ in calls})
    on_torch = certify(p, backend="torch", progress=lambda done, total: None)  # the torch path, block by block
    for field in fields(whole):
        torch.testing.assert_close(
            getattr(on_torch, field.name), getattr(certify(p, backend="torch"), field.name), rtol=0, atol=0
        )
    p[2, 299, 3] = float("nan")
    with pytest.raises(InputError, match=r"row 899 \(index \(2, 299\) of the leading shape \(3, 300\)"):
        certify(p, progress=lambda done, total: None)
