"""numba vs torch agreement, dtype/shape/dim/device handling, and the import-weight rule."""

from __future__ import annotations

import pytest
import torch

from attnsens.theta import ThetaCertificate, ThetaMethod, certify
from tests.imports import modules_loaded_by
from tests.unit.theta.rows import softmax_rows, sums_error_free, with_zeros


def _mixed_rows() -> torch.Tensor:
    blocks = [softmax_rows(40, 97, sigma, seed=i) for i, sigma in enumerate((0.5, 1.0, 2.0, 4.0, 8.0))]
    blocks.append(with_zeros(softmax_rows(40, 97, 2.0, seed=9), 0.85, seed=9))
    return torch.cat(blocks)


def test_numba_and_torch_agree() -> None:
    """Both intervals contain θ, so they overlap; rows both prove exact carry the same enclosure."""
    rows = _mixed_rows()
    a = certify(rows, backend="numba")
    b = certify(rows, backend="torch")
    assert bool((a.lower <= b.upper).all() and (b.lower <= a.upper).all())
    torch.testing.assert_close(a.row_sum, b.row_sum, rtol=0, atol=1e-13)
    torch.testing.assert_close(a.p_max, b.p_max, rtol=0, atol=0)
    both = a.exact & b.exact
    assert int(both.sum()) >= 60
    for i in torch.nonzero(both).flatten().tolist():
        if sums_error_free(rows[i]):
            assert float(a.lower[i]) == float(b.lower[i]) and float(a.upper[i]) == float(b.upper[i])
        else:
            torch.testing.assert_close(a.lower[i], b.lower[i], rtol=0, atol=1e-12)
    # the torch path is allowed to be weaker, never sharper than what numba proves
    assert bool((b.exact & ~a.exact).sum() == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_accepted_dtypes(dtype: torch.dtype) -> None:
    p = softmax_rows(5, 33, 1.0, seed=1, dtype=torch.float64).to(dtype)
    cert = certify(p, tolerance=1e-2)
    assert cert.lower.dtype == torch.float64 and cert.upper.dtype == torch.float64
    assert cert.exact.dtype == torch.bool and cert.method.dtype == torch.int8
    assert cert.row_sum.dtype == torch.float64 and cert.p_max.dtype == torch.float64
    torch.testing.assert_close(cert.p_max, p.to(torch.float64).amax(-1), rtol=0, atol=0)


def test_shapes_and_dim() -> None:
    """Leading shape [batch=2, head=3, query=5] kept; certifying along dim=1 equals moving that axis last."""
    p = softmax_rows(30, 7, 2.0, seed=2).reshape(2, 3, 5, 7)
    cert = certify(p)
    assert cert.shape == (2, 3, 5) and cert.lower.shape == cert.upper.shape == (2, 3, 5)
    moved = certify(p.permute(0, 3, 1, 2).contiguous(), dim=1)
    torch.testing.assert_close(moved.lower, cert.lower, rtol=0, atol=0)
    torch.testing.assert_close(moved.upper, cert.upper, rtol=0, atol=0)
    single = certify(p[1, 2, 4])
    assert single.shape == () and float(single.lower) == float(cert.lower[1, 2, 4])
    assert isinstance(cert[1], ThetaCertificate) and cert[1].shape == (3, 5)
    empty = certify(torch.zeros(0, 4))
    assert empty.shape == (0,)


def test_device_is_kept_and_torch_backend_runs_on_it() -> None:
    p = softmax_rows(4, 11, 1.0, seed=3)
    for backend in ("auto", "torch"):
        cert = certify(p.to("cpu"), backend=backend)
        assert all(t.device == p.device for t in (cert.lower, cert.upper, cert.exact, cert.method))


def test_convenience_properties() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0], [0.7, 0.2, 0.1]])
    cert = certify(p)
    torch.testing.assert_close(cert.width, cert.upper - cert.lower)
    assert cert.dominant.tolist() == [True, True]
    assert cert.method_names()[1] in {m.name for m in ThetaMethod}
    assert len(cert) == 2


def test_import_does_not_load_heavy_modules() -> None:
    heavy = ("numba", "transformers", "pyarrow", "duckdb", "matplotlib", "typer")
    assert modules_loaded_by("attnsens.theta", heavy) == []


def test_enclosure_is_the_same_in_numpy_and_in_torch() -> None:
    """CPU certificates go through NumPy, other devices through torch: the float64 operations must agree bit for bit."""
    import numpy as np

    from attnsens.theta._enclosure import _enclosure

    gen = torch.Generator().manual_seed(3)
    s_hat = 1.0 + (torch.rand(4000, generator=gen, dtype=torch.float64) - 0.5) * 1e-6
    d_found = torch.rand(4000, generator=gen, dtype=torch.float64) * 0.1
    d_lb = d_found * torch.rand(4000, generator=gen, dtype=torch.float64)
    err = torch.where(torch.rand(4000, generator=gen) < 0.5, torch.zeros(4000, dtype=torch.float64), 1e-13 * s_hat)
    d_found[:10] = 0.0  # perfect bisections
    d_lb[:10] = 0.0
    by_torch = _enclosure(torch, s_hat, d_found, d_lb, err)
    by_numpy = _enclosure(np, *(t.numpy() for t in (s_hat, d_found, d_lb, err)))
    for a, b in zip(by_torch, by_numpy, strict=True):
        assert torch.equal(a, torch.from_numpy(b))
    assert bool((by_torch[0] <= by_torch[1]).all())


def test_small_batches_are_shared_out_in_smaller_takes() -> None:
    """Each thread gets at least TASKS_PER_THREAD takes of blocks where the batch allows, never more than
    CHUNK_BLOCKS blocks a take: an audit chunk of 1,152 rows goes out a block at a time (blocks of 8 rows: 4 at a
    time), a large batch CHUNK_BLOCKS at a time."""
    from attnsens.theta._numba_kernels import CHUNK_BLOCKS, ROW_BLOCK, TASKS_PER_THREAD, chunk_blocks

    assert chunk_blocks(1152, 2) == 1
    assert chunk_blocks(1152, 2, block=8) == 4
    assert chunk_blocks(65536, 2) == CHUNK_BLOCKS
    assert chunk_blocks(8, 2) == chunk_blocks(0, 4) == 1
    for block in (8, ROW_BLOCK):
        for rows in (100, 1152, 5000, 40_000):
            for threads in (1, 2, 8):
                take = chunk_blocks(rows, threads, block)
                blocks = -(-rows // block)
                assert 1 <= take <= CHUNK_BLOCKS
                assert take == 1 or blocks // take >= threads * TASKS_PER_THREAD
