"""Numba CPU kernels of the θ certificate cascade (docs/theta-algorithms.md §3, §6 "Interleaved first-fit").

Every row is reduced to five float64 numbers (see ``certify_rows``): the computed sum ŝ, p_max, the bisection
distance d̂ of the best subset found, a proved lower bound d̂_lb on d* = min_S |p(S) − s/2|, and the radius E of
the rounding error of every computed distance. ``certificate.py`` turns them into an outward-rounded interval.

Rounding model (docs/theta-algorithms.md §1 "Exact over float values"). Every distance the kernels compute is a
signed sum of distinct stored values and of t = ŝ/2, evaluated by at most n + 16 float64 additions whose
operands are bounded by s, so its absolute error is at most (1.5·n + 13)·u·s (Higham, Thm 4.2; u = 2^-53).
We use E = (2n + 16)·u·ŝ·(1 + 2^-10). When every value is an integer multiple of a power-of-two quantum q and
ŝ ≤ 2^52·q, every partial sum and difference is an exact float64, so E = 0.

Order of the cascade per row: scan (``_numba_scan``); dominant atom; on rows of more than 128 keys, the whole row
first-fit into t = ŝ/2 in key order, then from the last key back, then by binade (no top-K needed when they settle, as
on 98 % of SmolLM2's non-dominant long rows); top-8 relaxation; meet-in-the-middle and its shortcuts for short rows;
one-target first-fit into the best top-8 target; then in ``_numba_refine``: 16-target first-fit, Karmarkar–Karp and the
greedy split with best exchanges, the cardinality-pruned search and the top-14 relaxation, budgeted CKK. This module
holds the driver; the stages live in ``_numba_first_fit`` (the fills), ``_numba_refine``, ``_numba_partition``,
``_numba_cardinality``, ``_numba_four_list`` and ``_numba_enumeration``. Rows are processed in blocks of ``ROW_BLOCK``.
The whole-row first-fit adds whole blocks of keys by vectorised sums while they fit, and its key-by-key walk, like the
top-8-target first-fit a chain of dependent add/compare steps, runs interleaved over the block's rows so that the chains
overlap in the pipeline (``_numba_first_fit._whole_row_first_fits``).

Every function is compiled with ``attnsens._numba_cache.cached_njit``: the on-disk cache sits in a folder
named by a hash of all kernel sources, so an edit to any ``_numba_*.py`` recompiles the whole cascade.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
from numba import get_num_threads, get_thread_id, parallel_chunksize, prange

from attnsens._float64 import UNIT_ROUNDOFF
from attnsens._numba_cache import cached_njit
from attnsens.theta._constants import (
    ENUMERATED_AFTER_PROOFS,
    ERROR_RADIUS_OFFSET,
    ERROR_RADIUS_PER_KEY,
    ERROR_RADIUS_SLACK,
    EXACT_SUM_QUANTA_LOG2,
    K_SMALL,
    LOWEST_BIT_MAX_SUPPORT,
    MITM_CHEAP_SUPPORT,
    SMALLEST_EXACT_SUM,
)
from attnsens.theta._numba_enumeration import mitm_workspace
from attnsens.theta._numba_first_fit import (
    BINADES,
    _binade_first_fit,
    _interleaved_first_fit,
    _sort_into,
    _whole_row_first_fits,
)
from attnsens.theta._numba_four_list import FOUR_LIST_LONG_WORK, FOUR_LIST_WORK
from attnsens.theta._numba_partition import meet_in_the_middle
from attnsens.theta._numba_refine import (
    EXACT_FIRST_MAX_SUPPORT,
    MITM_FALLBACK_SUPPORT,
    SHORT_ROW_SUPPORT,
    prove_short_row,
    refine_row,
    relaxation,
    relaxation_scratch,
    settled,
)
from attnsens.theta._numba_scan import row_lowest_bit, scan_row, top_k
from attnsens.theta.methods import RowStatus, ThetaMethod

ROW_BLOCK = 64
"""Rows the cascade takes together (``_certify_block``): their scratch arrays are allocated once for the block, and
the interleaved first-fits walk four of the block's rows at a time, a lane taking the block's next row as its row
ends, so that more rows keep more lanes busy. Against blocks of 8 rows (AVX2 machine, 2 threads, fastest of
seven): certify on 65,536 full rows of 1,024 keys 45.2–45.8 → 30.4 ms, on as many causal rows 85.2–86.2 → 75.5 ms
(32 rows: 33.3 and 78.8 ms; 128 and 256: 28.1–29.0 and 74.6–76.6 ms). One thread, the causal rows' dominant atoms
of up to 24 keys cost 0.29 → 0.16 µs a row in the kernel, its first-fit rows of 513–1,024 keys 1.34 → 0.90 µs.
The audit's one-pass statistics take fewer rows a block on long rows (``statistics_block_rows``)."""
CHUNK_BLOCKS = 4
"""Threads take blocks of rows up to CHUNK_BLOCKS at a time as they finish (dynamic schedule): rows cost very
different amounts (a causal head's short and long rows, the rare rows that need the late stages), and a core
slowed by other work would otherwise hold up the whole call. With blocks of 64 rows, takes of 1, 2, 4 and 16 blocks
gave the same times within 2 % (the causal rows above, and the audit's chunks at 512 and 2,048 tokens)."""
TASKS_PER_THREAD = 16
"""Smaller batches take fewer blocks at a time, so that each thread gets at least this many takes
(``chunk_blocks``). An audit chunk of SmolLM2 at 512 tokens is 1,152 rows, 18 blocks, taken one at a time."""
SEARCH_NODES = 2_000
QUICK_SEARCH_NODES = 500
"""Node budgets of the CKK probe of ``prove_short_row`` when meet-in-the-middle follows (exact) and when it does
not (certify: rows left open go on through the cascade)."""
COUNT_MITM_NODES = 5_000
"""Node budget of the count-pruned meet-in-the-middle of ``prove_short_row`` in ``certify`` (about 25 µs): it
proves most near-uniform odd rows without a perfect split (on the tiny GPT's early rows of 25–32 keys, 32 → 68 %
exact with it and the four-list search from 25 keys; 20,000 nodes reach 71 % for over three times the added
time)."""
LONG_SEARCH_NODES = 200_000
"""Before enumerating a row longer than ``MITM_FALLBACK_SUPPORT`` keys (up to 0.25 s at 48), in ``exact``,
the count-pruned meet-in-the-middle gets 200,000 nodes (about 1 ms) instead of the 5,000 of ``certify``."""
ENUMERATION_TASK_BLOCKS = 2
"""Where ``mitm_max`` exceeds ``ENUMERATED_AFTER_PROOFS`` (``exact``, ``certify``'s ``exact_support``), a parallel
task runs 2 blocks of rows (128 rows) in turn, and they share one enumeration workspace: each new workspace of
2^(n/2) sums costs its page faults once (at 48 keys about 0.2 s, as long as an enumeration). Otherwise a task is
one block, as the enumeration there never needs more than 2^13 sums a list."""
FOUR_LIST_ENUMERATION_SHARE = 2
"""Before enumerating a row of n > ``MITM_FALLBACK_SUPPORT`` keys, the four-list search may use up to
2^(n/2 − 2) pair sums (at least ``FOUR_LIST_LONG_WORK``): at about 3 ns a pair sum against about 8 ns for each
of the enumeration's 2^(n/2) sums a half, a tenth of the enumeration's time at most. Of the rows of 41–48 keys
``certify`` leaves open, 2^22 pair sums (6–9 ms a row) found a perfect split in 24–48 % (the tiny GPT, SmolLM2,
causal synthetic rows), where the enumeration takes 15–130 ms; the short budget found none."""

_OK = int(RowStatus.OK)
_BAD_SUM = int(RowStatus.BAD_SUM)

_MITM = int(ThetaMethod.MEET_IN_THE_MIDDLE)
_DOMINANT = int(ThetaMethod.DOMINANT_ATOM)
_K_ATOM = int(ThetaMethod.K_ATOM_RELAXATION)
_PERFECT = int(ThetaMethod.PERFECT_PARTITION)
_FF_ONE = int(ThetaMethod.FIRST_FIT_ONE_TARGET)
_FF_BINADES = int(ThetaMethod.FIRST_FIT_BINADES)


@cached_njit()
def _error_radius(s, n, q):
    """E: bound on the absolute error of every computed distance (0 when sums are provably exact)."""
    if s >= SMALLEST_EXACT_SUM and s <= math.ldexp(q, EXACT_SUM_QUANTA_LOG2):
        return 0.0
    return (ERROR_RADIUS_PER_KEY * n + ERROR_RADIUS_OFFSET) * UNIT_ROUNDOFF * s * ERROR_RADIUS_SLACK


@cached_njit()
def _scan_block(
    x, bits, no_positive, r0, nb, exact_quantum, mitm_max, check_sum, tolerance, row_sum, p_max, d_found, d_lb, err,
    method, status, ns, ends, qs, thresholds, firsts, whole_row, pending,
):  # fmt: skip
    """The first stage of ``_certify_block``: each row of the block scanned (its sum, support, p_max, grid and error
    radius), the dominant rows settled, and the others listed: long rows in ``whole_row`` (the whole row into t
    first), short ones in ``pending``. Returns ``(n_whole_row, n_pending, longest_enumerable)``: the block's longest
    row that may be enumerated sizes the enumeration's workspace (the short rows of a causal head are neighbours,
    and share a block)."""
    n_whole_row = 0
    n_pending = 0
    enumerable = max(mitm_max, ENUMERATED_AFTER_PROOFS, MITM_FALLBACK_SUPPORT)
    longest_enumerable = 0
    for j in range(nb):
        r = r0 + j
        s, n, pmax, q, end, st, threshold, first = scan_row(x[r], bits[r], no_positive, exact_quantum, K_SMALL)
        if st == _OK and check_sum and abs(s - 1.0) > tolerance:
            st = _BAD_SUM
        status[r] = st
        row_sum[r] = s
        p_max[r] = pmax
        method[r] = 0
        if st != _OK:
            continue
        e = _error_radius(s, n, q)
        err[r] = e
        t = 0.5 * s
        ns[j] = n
        ends[j] = end
        qs[j] = q
        thresholds[j] = threshold
        firsts[j] = first
        if pmax - t > e:
            d_found[r] = pmax - t
            d_lb[r] = pmax - t
            method[r] = _DOMINANT
            continue
        d_found[r] = np.inf
        d_lb[r] = 0.0
        if n > EXACT_FIRST_MAX_SUPPORT:  # long rows try the whole row into t first: no top-K when it settles
            whole_row[n_whole_row] = j
            n_whole_row += 1
        else:
            if e == 0.0 and not exact_quantum and n <= LOWEST_BIT_MAX_SUPPORT:  # float64 rows have it already
                qs[j] = row_lowest_bit(x[r], end)  # a coarser grid of the sums: more splits proved perfect
            if n <= enumerable:
                longest_enumerable = max(longest_enumerable, n)
            pending[n_pending] = j
            n_pending += 1
    return n_whole_row, n_pending, longest_enumerable


@cached_njit()
def _whole_rows(
    x, bits, r0, exact_quantum, stop_d, row_sum, p_max, d_found, d_lb, err, method, ends, qs, whole_row, n_whole_row,
    pending, n_pending,
):  # fmt: skip
    """The second stage of ``_certify_block``: the long rows of ``whole_row`` filled whole into t, in key order, then
    from their last key back (recent keys first) where that left them open, then by binades; the rows these settle
    are done, the others appended to ``pending``. Returns the new length of ``pending``."""
    shift, bias = (52, 1023) if exact_quantum else (23, 127)
    counts = np.empty(4 * BINADES, np.int64)
    masses = np.empty(4 * BINADES)
    grouped = np.empty(x.shape[1] if n_whole_row else 0)
    whole_row_d = np.empty(n_whole_row)
    _whole_row_first_fits(x, r0, whole_row, n_whole_row, ends, row_sum, stop_d, False, whole_row_d)
    reverse_rows = np.empty(n_whole_row, np.int64)
    reverse_of = np.empty(n_whole_row, np.int64)
    n_reverse = 0
    for a in range(n_whole_row):
        j = whole_row[a]
        if not settled(whole_row_d[a], qs[j], err[r0 + j], stop_d, _FF_ONE):
            reverse_rows[n_reverse] = j
            reverse_of[n_reverse] = a
            n_reverse += 1
    reverse_d = np.empty(n_reverse)
    _whole_row_first_fits(x, r0, reverse_rows, n_reverse, ends, row_sum, stop_d, True, reverse_d)
    for b in range(n_reverse):
        whole_row_d[reverse_of[b]] = min(whole_row_d[reverse_of[b]], reverse_d[b])
    for a in range(n_whole_row):
        j = whole_row[a]
        r = r0 + j
        t = 0.5 * row_sum[r]
        d = whole_row_d[a]
        stage = settled(d, qs[j], err[r], stop_d, _FF_ONE)
        if not stage:
            top_exponent = math.frexp(p_max[r])[1] - 1 + bias
            d = min(d, _binade_first_fit(x[r], bits[r], ends[j], t, stop_d, shift, bias, top_exponent, counts,
                                         masses, grouped))  # fmt: skip
            stage = settled(d, qs[j], err[r], stop_d, _FF_BINADES)
        d_found[r] = d
        if stage:
            d_lb[r] = d if stage == _PERFECT else 0.0
            method[r] = stage
            continue
        pending[n_pending] = j
        n_pending += 1
    return n_pending


@cached_njit()
def _certify_block(
    x, bits, no_positive, r0, r1, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status, workspace,
):  # fmt: skip
    """The cascade on rows r0:r1 of ``x`` (outputs as in ``certify_rows``). ``workspace`` holds the enumeration's
    lists (``mitm_workspace``); returns it, or a larger one where a row needed more."""
    nb = r1 - r0
    top_v = np.empty((ROW_BLOCK, K_SMALL))
    top_i = np.empty((ROW_BLOCK, K_SMALL), np.int64)
    skip = np.full((ROW_BLOCK, K_SMALL), -1, np.int64)
    scratch = relaxation_scratch(K_SMALL)
    ns = np.zeros(ROW_BLOCK, np.int64)
    ends = np.zeros(ROW_BLOCK, np.int64)
    qs = np.zeros(ROW_BLOCK)
    thresholds = np.zeros(ROW_BLOCK, bits.dtype)
    firsts = np.zeros(ROW_BLOCK, np.int64)
    targets = np.zeros(ROW_BLOCK)
    whole_row = np.empty(ROW_BLOCK, np.int64)
    pending = np.empty(ROW_BLOCK, np.int64)
    short_support = max(mitm_max, SHORT_ROW_SUPPORT)
    n_whole_row, n_pending, longest_enumerable = _scan_block(
        x, bits, no_positive, r0, nb, exact_quantum, mitm_max, check_sum, tolerance, row_sum, p_max, d_found, d_lb,
        err, method, status, ns, ends, qs, thresholds, firsts, whole_row, pending,
    )  # fmt: skip
    n_pending = _whole_rows(
        x, bits, r0, exact_quantum, stop_d, row_sum, p_max, d_found, d_lb, err, method, ends, qs, whole_row,
        n_whole_row, pending, n_pending,
    )  # fmt: skip

    n_open = 0
    for a in range(n_pending):
        j = pending[a]
        r = r0 + j
        n = ns[j]
        s = row_sum[r]
        t = 0.5 * s
        e = err[r]
        q = qs[j]
        top_k(x[r], bits[r], thresholds[j], firsts[j], ends[j], top_v[j], top_i[j])
        k_small = min(K_SMALL, n)
        tv = top_v[j, :k_small]
        dl, d_end, g = relaxation(tv, s - tv.sum(), t, scratch)
        if dl > e:
            d_found[r] = dl
            d_lb[r] = dl
            method[r] = _K_ATOM
            continue
        if n <= short_support:  # proved optimal where it is cheap: the proofs above come first
            d, m = np.inf, 0
            enumerated = n <= mitm_max or n <= ENUMERATED_AFTER_PROOFS
            if n > MITM_CHEAP_SUPPORT:
                # The enumeration costs up to ~1 ms at 32 keys and ~0.25 s at 48; the bounds and the
                # four-list search settle most rows first. Searches longer than ~0.1 ms only pay as shortcuts to
                # the full enumeration; rows it will not cover get short searches and go on through the cascade.
                probe = SEARCH_NODES if n <= mitm_max else QUICK_SEARCH_NODES
                search = LONG_SEARCH_NODES if MITM_FALLBACK_SUPPORT < n <= mitm_max else COUNT_MITM_NODES
                # Where the enumeration follows and costs about as much, the four-list search keeps its short budget.
                cheap_enumeration = enumerated and n <= MITM_FALLBACK_SUPPORT
                work = FOUR_LIST_WORK if cheap_enumeration else FOUR_LIST_LONG_WORK
                if enumerated and not cheap_enumeration:  # a shortcut to an enumeration of 2^(n/2) sums a half
                    work = max(work, (1 << (n // 2)) >> FOUR_LIST_ENUMERATION_SHARE)
                d, m = prove_short_row(x[r], n, t, q, e, K_SMALL, probe, search, work)
            if m == 0 and enumerated:
                if workspace.shape[1] < 1 << (n - n // 2):
                    workspace = mitm_workspace(longest_enumerable)
                d, m = meet_in_the_middle(x[r], n, t, e, min(d_found[r], d_end), workspace), _MITM
            if m != 0:
                d_found[r] = d
                d_lb[r] = d
                method[r] = m
                continue
        d_found[r] = min(d_found[r], d_end)
        d_lb[r] = dl
        targets[j] = g
        _sort_into(top_i[j, :k_small], skip[j])
        skip[j, k_small:] = -1  # the first-fit walks the sorted indices up to the first −1
        pending[n_open] = j
        n_open += 1

    ff_d = np.empty(n_open)
    _interleaved_first_fit(x, r0, pending, n_open, skip, targets, ends, stop_d, ff_d)

    for a in range(n_open):
        j = pending[a]
        r = r0 + j
        # A negative target means no top-8 subset T has t − p(T) ∈ [0, rest] (0 < d_lb ≤ err): the fill has no
        # subset to extend and its result is meaningless.
        fill_d = ff_d[a] if targets[j] >= 0.0 else np.inf
        d = min(d_found[r], fill_d)
        stage = settled(d, qs[j], err[r], stop_d, _FF_ONE)
        if stage:
            d_found[r] = d
            d_lb[r] = d if stage == _PERFECT else d_lb[r]
            method[r] = stage
            continue
        k_small = min(K_SMALL, ns[j])
        df, dl, m = refine_row(
            x[r], bits[r], ns[j], row_sum[r], qs[j], err[r], ends[j], stop_d, ckk_budget, ckk_max_support,
            top_v[j, :k_small], skip[j, :k_small], scratch, d, d_lb[r], workspace,
        )  # fmt: skip
        d_found[r] = df
        d_lb[r] = dl
        method[r] = m
    return workspace


@cached_njit()
def blocks_per_task(mitm_max):
    """Blocks of rows one parallel task runs in turn, sharing one enumeration workspace: 1, or
    ``ENUMERATION_TASK_BLOCKS`` where rows of more than ``ENUMERATED_AFTER_PROOFS`` keys may be enumerated."""
    return 1 if mitm_max <= ENUMERATED_AFTER_PROOFS else ENUMERATION_TASK_BLOCKS


@cached_njit()
def thread_workspace(workspaces):
    """This thread's workspace of ``workspaces`` (``thread_workspaces``), or an empty one if there is none for it."""
    thread = get_thread_id()
    return workspaces[thread] if thread < workspaces.shape[0] else mitm_workspace(0)


@cached_njit(parallel=True)
def certify_rows(
    x, bits, no_positive, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status, workspaces,
):  # fmt: skip
    """Run the cascade on every row of ``x`` [row, key] (float32 or float64, C-contiguous), in parallel (call it
    through ``certify_rows_balanced``).

    Args:
        bits, no_positive: ``x`` viewed as signed integers of its width (int32 / int64), and that type's largest
            value (``scan_row``).
        exact_quantum: True for float64 input (the quantum q is the lowest set bit over the row); False when
            the values are float32 numbers (q = 2^(e_min − 24)).
        stop_d: stop refining once the best subset has d ≤ stop_d (2^-13.5 for float32, 2^-28 for float64).
        mitm_max: rows with at most this many non-zeros are solved exactly by meet-in-the-middle.
        ckk_budget, ckk_max_support: node budget of the final CKK stage, and the largest support it runs on.
        check_sum, tolerance: flag rows with |ŝ − 1| > tolerance as BAD_SUM.
        workspaces: one enumeration workspace per thread (``thread_workspaces``).

    Outputs (one entry per row): ŝ, p_max, d̂ (best subset), d̂_lb (proved: d* ≥ d̂_lb − E), E, method, status.
    The true optimum satisfies d̂_lb − E ≤ d* ≤ d̂ + E.
    """
    n_rows = x.shape[0]
    n_blocks = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    per_task = blocks_per_task(mitm_max)
    for task in prange((n_blocks + per_task - 1) // per_task):
        workspace = thread_workspace(workspaces)
        for b in range(task * per_task, min(n_blocks, (task + 1) * per_task)):
            r0 = b * ROW_BLOCK
            r1 = min(n_rows, r0 + ROW_BLOCK)
            workspace = _certify_block(
                x, bits, no_positive, r0, r1, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support,
                check_sum, tolerance, row_sum, p_max, d_found, d_lb, err, method, status, workspace,
            )  # fmt: skip


def chunk_blocks(n_rows: int, threads: int, block: int = ROW_BLOCK) -> int:
    """Blocks of ``block`` rows a thread takes at a time: ``CHUNK_BLOCKS``, fewer where that would leave a thread
    fewer than ``TASKS_PER_THREAD`` takes, at least 1."""
    blocks = -(-n_rows // block)
    return max(1, min(CHUNK_BLOCKS, blocks // (threads * TASKS_PER_THREAD)))


_held_workspaces: dict[tuple[int, int], np.ndarray] | None = None


def workspace_bytes(mitm_max: int, n_keys: int) -> int:
    """Bytes of one thread's enumeration workspace (``thread_workspaces``): four lists of 2^⌈m/2⌉ float64 sums,
    m = min(mitm_max, n_keys), where rows of more than ``ENUMERATED_AFTER_PROOFS`` keys may be enumerated, else 0."""
    m = min(mitm_max, n_keys)
    return 32 << (m - m // 2) if mitm_max > ENUMERATED_AFTER_PROOFS else 0


def thread_workspaces(mitm_max: int, n_keys: int, threads: int) -> np.ndarray:
    """One enumeration workspace per thread for the kernels' calls, [threads, 4, 2^⌈m/2⌉] with m = min(mitm_max,
    n_keys) where rows of more than ``ENUMERATED_AFTER_PROOFS`` keys may be enumerated, else empty (the blocks
    then allocate the little they need). Untouched until used: a call faults in each thread's pages once,
    instead of once per task (a 512-token audit chunk holds nine heads' short rows, each head one task); within
    ``holding_workspaces`` the calls share them, and fault them in once."""
    size = workspace_bytes(mitm_max, n_keys) // 32
    if _held_workspaces is None or size == 0:
        return np.empty((threads, 4, size))
    if (threads, size) not in _held_workspaces:
        _held_workspaces[threads, size] = np.empty((threads, 4, size))
    return _held_workspaces[threads, size]


@contextlib.contextmanager
def holding_workspaces() -> Iterator[None]:
    """Within it, the kernels' calls reuse their enumeration workspaces (``thread_workspaces``) instead of fresh
    ones: an audit's chunks under ``exact_support`` then fault in 0.5 GiB a thread once (at 48 keys), not once
    per chunk. The memory is held until the block ends."""
    global _held_workspaces
    outer = _held_workspaces
    _held_workspaces = {} if outer is None else outer
    try:
        yield
    finally:
        _held_workspaces = outer


def chunk_tasks(n_rows: int, threads: int, mitm_max: int, block: int = ROW_BLOCK) -> int:
    """Tasks (``blocks_per_task`` blocks of ``block`` rows each) a thread takes at a time: ``chunk_blocks`` over the
    task size."""
    return max(1, chunk_blocks(n_rows, threads, block) // blocks_per_task(mitm_max))


def certify_rows_balanced(*args):
    """``certify_rows`` (same arguments) with threads taking ``chunk_tasks`` tasks of rows at a time."""
    with parallel_chunksize(chunk_tasks(args[0].shape[0], get_num_threads(), args[5])):
        certify_rows(*args)


@cached_njit()
def certify_rows_serial(
    x, bits, no_positive, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status, workspaces,
):  # fmt: skip
    """``certify_rows`` on one thread: small batches, where waking the thread pool costs more than the work."""
    n_rows = x.shape[0]
    workspace = workspaces[0]
    for r0 in range(0, n_rows, ROW_BLOCK):
        workspace = _certify_block(
            x, bits, no_positive, r0, min(n_rows, r0 + ROW_BLOCK), exact_quantum, stop_d, mitm_max, ckk_budget,
            ckk_max_support, check_sum, tolerance, row_sum, p_max, d_found, d_lb, err, method, status, workspace,
        )  # fmt: skip
