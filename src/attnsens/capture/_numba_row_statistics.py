"""Every per-row statistic of a chunk of float32 attention rows in one parallel pass: the θ cascade and its
enclosure, and the moments (max, argmax, Σp, Σp², −Σ p log p, nonzero count).

``row_statistics`` called ``certify`` and then the moments kernel: two waits on numba's thread pool, and between
them the enclosure and the certificate's bookkeeping as a few dozen small array operations. On a 512-token
SmolLM2 audit (120 chunks of 1,152 rows) those steps cost about 1.7 ms a chunk, a tenth of the audit. Here each
block of rows goes through the cascade (``certify_block``, the code ``certify`` runs), is enclosed row by row
(``theta_interval``, the same operations as ``theta_enclosure``) and then read once more for its moments while
it is still in the cache (``moments_of_row``, the code of ``row_moments``). The results are those of ``certify`` and
``row_moments`` bit for bit (``tests/unit/capture/test_fused_statistics.py``). Given the rows' logits, as the
audit gives them, the entropy is taken from those instead (``moments_of_row_logits``, docs/math.md §2.4).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from attnsens._numba_cache import cached_njit
from attnsens.capture._numba_moments import NO_POSITIVE, moments_of_row, moments_of_row_logits
from attnsens.theta.kernels import ROW_BLOCK, blocks_per_task, certify_block, theta_interval, thread_workspace

STATISTICS_BLOCK_BYTES = 1 << 20
"""A block's rows and logits (8 bytes a key) are read again for the moments right after the cascade, so on long
rows a block holds fewer than ``ROW_BLOCK`` rows, as many as fit in 1 MiB (at least ``MIN_STATISTICS_BLOCK``).
SmolLM2's audit chunks (every third at 512 tokens, every eighth at 2,048, every sixtieth at 8,192; AVX2 machine,
2 threads, fastest of six rounds): blocks of 8 rows 66.6, 120.7 and 144.8 ms; of 64 rows 55.9, 108.1 and 148.5;
of 16 rows 62.0, 113.4 and 141.0; by this budget 57.1, 107.6 and 134.8."""
MIN_STATISTICS_BLOCK = 8


def statistics_block_rows(n_keys: int) -> int:
    """Rows a block of the one-pass statistics holds on rows of ``n_keys`` keys (``STATISTICS_BLOCK_BYTES``)."""
    return max(MIN_STATISTICS_BLOCK, min(ROW_BLOCK, STATISTICS_BLOCK_BYTES // (8 * max(1, n_keys))))


@cached_njit()
def _statistics_block(
    x, bits, no_positive, r0, r1, stop_d, mitm_max, ckk_budget, ckk_max_support, tolerance, row_sum, theta_p_max,
    d_found, d_lb, err, method, status, lower, upper, p_max, argmax, total, squares, entropy, nonzero, logits,
    workspace,
):  # fmt: skip
    workspace = certify_block(
        x, bits, no_positive, r0, r1, False, stop_d, mitm_max, ckk_budget, ckk_max_support, True, tolerance, row_sum,
        theta_p_max, d_found, d_lb, err, method, status, workspace,
    )  # fmt: skip
    for r in range(r0, r1):
        lower[r], upper[r] = theta_interval(row_sum[r], d_found[r], d_lb[r], err[r])
        if logits.shape[0]:
            p_max[r], argmax[r], total[r], squares[r], entropy[r], nonzero[r] = moments_of_row_logits(
                x[r], bits[r], logits[r]
            )
        else:
            p_max[r], argmax[r], total[r], squares[r], entropy[r], nonzero[r] = moments_of_row(x[r], bits[r])
    return workspace


@cached_njit(parallel=True)
def row_statistics_rows(
    x, stop_d, mitm_max, ckk_budget, ckk_max_support, tolerance, row_sum, theta_p_max, d_found, d_lb, err, method,
    status, lower, upper, p_max, argmax, total, squares, entropy, nonzero, logits, workspaces, block,
):  # fmt: skip
    """The cascade (float32 ``x`` [row, key], C-contiguous; sums checked against ``tolerance``), θ's interval
    [``lower``, ``upper``] and the moments of every row, in parallel over blocks of rows (call it within
    ``parallel_chunksize(chunk_tasks(...))``, as ``certify_rows_balanced`` does). Outputs as in ``certify_rows`` and
    ``row_moments``; ``workspaces`` as in ``certify_rows``. ``logits``: the rows' float32 logits [row, key], from
    which the entropy is taken (``moments_of_row_logits``), or an array of no rows for −Σ p log p of the values.
    ``block``: rows a block holds (``statistics_block_rows``; at most ``ROW_BLOCK``, the size of the cascade's
    scratch arrays)."""
    block = max(1, min(block, ROW_BLOCK))
    bits = x.view(np.int32)
    n_blocks = (x.shape[0] + block - 1) // block
    per_task = blocks_per_task(mitm_max)
    for task in prange((n_blocks + per_task - 1) // per_task):
        workspace = thread_workspace(workspaces)
        for b in range(task * per_task, min(n_blocks, (task + 1) * per_task)):
            r0 = b * block
            workspace = _statistics_block(
                x, bits, NO_POSITIVE, r0, min(x.shape[0], r0 + block), stop_d, mitm_max, ckk_budget,
                ckk_max_support, tolerance, row_sum, theta_p_max, d_found, d_lb, err, method, status, lower, upper,
                p_max, argmax, total, squares, entropy, nonzero, logits, workspace,
            )  # fmt: skip


@cached_njit()
def row_statistics_rows_serial(
    x, stop_d, mitm_max, ckk_budget, ckk_max_support, tolerance, row_sum, theta_p_max, d_found, d_lb, err, method,
    status, lower, upper, p_max, argmax, total, squares, entropy, nonzero, logits, workspaces, block,
):  # fmt: skip
    """``row_statistics_rows`` on one thread: small batches, where waking the thread pool costs more than the work."""
    block = max(1, min(block, ROW_BLOCK))
    bits = x.view(np.int32)
    workspace = workspaces[0]
    for r0 in range(0, x.shape[0], block):
        workspace = _statistics_block(
            x, bits, NO_POSITIVE, r0, min(x.shape[0], r0 + block), stop_d, mitm_max, ckk_budget, ckk_max_support,
            tolerance, row_sum, theta_p_max, d_found, d_lb, err, method, status, lower, upper, p_max, argmax, total,
            squares, entropy, nonzero, logits, workspace,
        )  # fmt: skip
