"""Numba CPU kernels of the θ certificate cascade (THETA_ALGORITHMS.md §3, §6 "TUNED").

Every row is reduced to five float64 numbers (see ``certify_rows``): the computed sum ŝ, p_max, the bisection
distance d̂ of the best subset found, a proved lower bound d̂_lb on d* = min_S |p(S) − s/2|, and the radius E of
the rounding error of every computed distance. ``certificate.py`` turns them into an outward-rounded interval.

Rounding model (THETA_ALGORITHMS.md §1 "Exact over float values"). Every distance the kernels compute is a
signed sum of distinct stored values and of t = ŝ/2, evaluated by at most n + 16 float64 additions whose
operands are bounded by s, so its absolute error is at most (1.5·n + 13)·u·s (Higham, Thm 4.2; u = 2^-53).
We use E = (2n + 16)·u·ŝ·(1 + 2^-10). When every value is an integer multiple of a power-of-two quantum q and
ŝ ≤ 2^52·q, every partial sum and difference is an exact float64, so E = 0.

Rows are processed in blocks of ``ROW_BLOCK``; the one-target first-fit, a chain of dependent add/compare
steps, runs interleaved over the block's rows so that the chains overlap in the pipeline.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from attnsens.theta._numba_partition import (
    CKK_EXHAUSTED,
    CKK_PERFECT,
    complete_karmarkar_karp,
    karmarkar_karp,
    meet_in_the_middle,
    support_values,
)
from attnsens.theta.methods import RowStatus, ThetaMethod

UNIT_ROUNDOFF = 2.0**-53
K_SMALL = 8
K_LARGE = 14
N_TARGETS = 16
ROW_BLOCK = 8
MITM_CHEAP_SUPPORT = 24
PERFECT_PROBE_NODES = 2000

_OK = int(RowStatus.OK)
_NON_FINITE = int(RowStatus.NON_FINITE)
_NEGATIVE = int(RowStatus.NEGATIVE)
_EMPTY = int(RowStatus.EMPTY)
_BAD_SUM = int(RowStatus.BAD_SUM)

_MITM = int(ThetaMethod.MEET_IN_THE_MIDDLE)
_DOMINANT = int(ThetaMethod.DOMINANT_ATOM)
_K_ATOM = int(ThetaMethod.K_ATOM_RELAXATION)
_PERFECT = int(ThetaMethod.PERFECT_PARTITION)
_FF_ONE = int(ThetaMethod.FIRST_FIT_ONE_TARGET)
_FF_SIXTEEN = int(ThetaMethod.FIRST_FIT_SIXTEEN_TARGETS)
_KK = int(ThetaMethod.KARMARKAR_KARP)
_K_ATOM_14 = int(ThetaMethod.K_ATOM_RELAXATION_14)
_TOP14_ENDPOINT = int(ThetaMethod.TOP14_ENDPOINT)
_CKK_PROVED = int(ThetaMethod.CKK_PROVED)
_CKK_BUDGET = int(ThetaMethod.CKK_BUDGET)


@njit(cache=True)
def _lowest_bit(x):
    """The weight 2^k of the lowest set mantissa bit of a positive float64 x (x is a multiple of it)."""
    m, e = math.frexp(x)
    mantissa = np.int64(m * 9007199254740992.0)
    return math.ldexp(np.float64(mantissa & -mantissa), e - 53)


@njit(cache=True)
def _insert_top(top_v, top_i, x, i):
    """Insert value x (index i) into the descending top-K buffer; ties keep the earlier index first."""
    j = top_v.size - 1
    while j > 0 and top_v[j - 1] < x:
        top_v[j] = top_v[j - 1]
        top_i[j] = top_i[j - 1]
        j -= 1
    top_v[j] = x
    top_i[j] = i


@njit(cache=True)
def _scan_row(row, exact_quantum, top_v, top_i):
    """One pass: sum, support size, p_max, quantum q, end of support, validity, and the top-K values/indices.

    ``top_v``/``top_i`` receive the K largest values in descending order (ties: earlier index first).
    Four partial sums break the add-latency chain (any summation order obeys the same error bound); NaN and
    ±Inf surface in the sum, negative values in the running minimum, so the loop carries no validity branches.
    Without ``exact_quantum`` the values are float32 numbers, so 2^(e_min − 24) divides all of them.
    """
    k_top = top_v.size
    for k in range(k_top):
        top_v[k] = -1.0
        top_i[k] = -1
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    lowest = 0.0
    p_min = np.inf
    n = 0
    end = 0
    size = row.size
    quad_end = size - size % 4
    for i in range(0, quad_end, 4):
        x0 = np.float64(row[i])
        x1 = np.float64(row[i + 1])
        x2 = np.float64(row[i + 2])
        x3 = np.float64(row[i + 3])
        s0 += x0
        s1 += x1
        s2 += x2
        s3 += x3
        lowest = min(lowest, min(min(x0, x1), min(x2, x3)))
        p_min = min(p_min, min(min(x0 if x0 > 0.0 else np.inf, x1 if x1 > 0.0 else np.inf),
                               min(x2 if x2 > 0.0 else np.inf, x3 if x3 > 0.0 else np.inf)))  # fmt: skip
        n += (x0 > 0.0) + (x1 > 0.0) + (x2 > 0.0) + (x3 > 0.0)
        high = max(max(x0, x1), max(x2, x3))
        if high > 0.0:
            end = i + 4 if x3 > 0.0 else (i + 3 if x2 > 0.0 else (i + 2 if x1 > 0.0 else i + 1))
        if high > top_v[k_top - 1]:
            for k in range(4):
                xk = np.float64(row[i + k])
                if xk > top_v[k_top - 1]:
                    _insert_top(top_v, top_i, xk, i + k)
    for i in range(quad_end, size):
        x = np.float64(row[i])
        s0 += x
        lowest = min(lowest, x)
        if x > 0.0:
            p_min = min(p_min, x)
            n += 1
            end = i + 1
            if x > top_v[k_top - 1]:
                _insert_top(top_v, top_i, x, i)
    total = (s0 + s1) + (s2 + s3)
    p_max = max(top_v[0], 0.0)
    status = _OK
    if not math.isfinite(total):
        status = _NON_FINITE
    elif lowest < 0.0:
        status = _NEGATIVE
    elif n == 0:
        status = _EMPTY
    q = np.inf
    if status == _OK:
        if exact_quantum:
            for i in range(end):
                x = np.float64(row[i])
                if x > 0.0:
                    q = min(q, _lowest_bit(x))
        else:
            q = math.ldexp(1.0, math.frexp(p_min)[1] - 24)
    return total, n, p_max, q, end, status


@njit(cache=True)
def _error_radius(s, n, q):
    """E: bound on the absolute error of every computed distance (0 when sums are provably exact)."""
    if s >= 2.0**-1000 and s <= math.ldexp(q, 52):
        return 0.0
    return (2.0 * n + 16.0) * UNIT_ROUNDOFF * s * (1.0 + 2.0**-10)


@njit(cache=True)
def _proves_perfect(d, q, e):
    """With exact sums every 2·d(S) ≡ s/q (mod 2) in units of q, so 2d ≤ q is optimal."""
    return e == 0.0 and 2.0 * d <= q


@njit(cache=True)
def _subset_sums_unsorted(top_v, sums):
    """sums[T] = Σ_{k ∈ T} top_v[k] for every bitmask T (doubling)."""
    sums[0] = 0.0
    for k in range(top_v.size):
        step = 1 << k
        for j in range(step):
            sums[step + j] = sums[j] + top_v[k]


@njit(cache=True)
def _relaxation(top_v, rest, t, sums):
    """Top-K relaxation (THETA_ALGORITHMS.md §1 "K-atom regime").

    Returns (d_lb, d_endpoint, target): d_lb = min_T dist(t, [p(T), p(T) + rest]) ≤ d* (= d* when > 0);
    d_endpoint = the best of the subsets T and T ∪ tail; target = t − p(T) ∈ [0, rest] closest to rest/2.
    """
    _subset_sums_unsorted(top_v, sums)
    d_lb = np.inf
    d_end = np.inf
    target = -1.0
    target_score = np.inf
    half_rest = 0.5 * rest
    for j in range(1 << top_v.size):
        a = sums[j]
        lo = a - t
        hi = t - (a + rest)
        d_end = min(d_end, abs(lo), abs(hi))
        if lo > 0.0:
            d_lb = min(d_lb, lo)
        elif hi > 0.0:
            d_lb = min(d_lb, hi)
        else:
            d_lb = 0.0
            g = t - a
            score = abs(g - half_rest)
            if score < target_score:
                target_score = score
                target = g
    return d_lb, d_end, target


@njit(cache=True)
def _best_targets(top_v, rest, t, sums, out_g):
    """Fill ``out_g`` with the (up to) len(out_g) targets t − p(T) ∈ [0, rest] closest to rest/2; return count."""
    _subset_sums_unsorted(top_v, sums)
    m = out_g.size
    score = np.full(m, np.inf)
    count = 0
    half_rest = 0.5 * rest
    for j in range(1 << top_v.size):
        a = sums[j]
        if a <= t and t <= a + rest:
            g = t - a
            sc = abs(g - half_rest)
            if count < m or sc < score[m - 1]:
                k = min(count, m - 1)
                while k > 0 and score[k - 1] > sc:
                    score[k] = score[k - 1]
                    out_g[k] = out_g[k - 1]
                    k -= 1
                score[k] = sc
                out_g[k] = g
                count = min(count + 1, m)
    return count


@njit(cache=True)
def _first_fit_targets(row, end, skip_sorted, targets, count):
    """First-fit of the tail (original order, ``skip_sorted`` indices left out) into each target capacity.

    Returns the best d over targets: min(gap, e_min − gap) with gap = g − (filled mass) and e_min the smallest
    element that did not fit (its addition overshoots by e_min − gap).
    """
    fill = np.zeros(count)
    e_min = np.full(count, np.inf)
    sp = 0
    n_skip = skip_sorted.size
    for i in range(end):
        if sp < n_skip and i == skip_sorted[sp]:
            sp += 1
            continue
        x = np.float64(row[i])
        for m in range(count):
            c = fill[m] + x
            if c <= targets[m]:
                fill[m] = c
            elif x < e_min[m]:
                e_min[m] = x
    best = np.inf
    for m in range(count):
        gap = targets[m] - fill[m]
        best = min(best, gap, e_min[m] - gap)
    return best


@njit(cache=True)
def _top_k(row, end, k_top):
    top_v = np.empty(k_top)
    top_i = np.empty(k_top, np.int64)
    for k in range(k_top):
        top_v[k] = -1.0
        top_i[k] = -1
    for i in range(end):
        x = np.float64(row[i])
        if x > top_v[k_top - 1]:
            _insert_top(top_v, top_i, x, i)
    return top_v, top_i


@njit(cache=True)
def _refine_row(row, n, s, q, e, end, stop_d, ckk_budget, ckk_max_support, top_v, top_i, d_found, d_lb):
    """Stages after the one-target first-fit: 16 targets, KK, top-14 relaxation, budgeted CKK.

    Returns (d_found, d_lb, method).
    """
    t = 0.5 * s
    rest = s - top_v.sum()
    targets = np.empty(N_TARGETS)
    count = _best_targets(top_v, rest, t, np.empty(1 << top_v.size), targets)
    if count > 0:
        d_found = min(d_found, _first_fit_targets(row, end, np.sort(top_i), targets, count))
    if _proves_perfect(d_found, q, e):
        return d_found, d_found, _PERFECT
    if d_found <= stop_d:
        return d_found, d_lb, _FF_SIXTEEN

    d_found = min(d_found, karmarkar_karp(row, n))
    if _proves_perfect(d_found, q, e):
        return d_found, d_found, _PERFECT
    if d_found <= stop_d:
        return d_found, d_lb, _KK

    k_large = min(K_LARGE, n)
    top14_v, _ = _top_k(row, end, k_large)
    d_lb14, d_end14, _ = _relaxation(top14_v, s - top14_v.sum(), t, np.empty(1 << k_large))
    d_found = min(d_found, d_end14)
    if d_lb14 > e:
        return d_lb14, d_lb14, _K_ATOM_14
    d_lb = max(d_lb, d_lb14)
    if d_found <= stop_d:
        return d_found, d_lb, _TOP14_ENDPOINT

    if n > ckk_max_support:
        return d_found, d_lb, _CKK_BUDGET
    vals = np.sort(support_values(row, n))[::-1].copy()
    quantum_diff = q if e == 0.0 else -1.0
    best_diff, outcome = complete_karmarkar_karp(vals, 2.0 * stop_d, quantum_diff, ckk_budget)
    d_found = min(d_found, 0.5 * best_diff)
    if outcome == CKK_EXHAUSTED or outcome == CKK_PERFECT:
        return 0.5 * best_diff, 0.5 * best_diff, _CKK_PROVED
    return d_found, d_lb, _CKK_BUDGET


@njit(cache=True)
def _first_fit_quad(x, rows, skip, targets, stop, out):
    """One-target first-fit of four rows at once, state in registers, no data-dependent branches.

    A single first-fit is a chain of dependent add/compare steps (latency-bound); four independent chains
    overlap in the pipeline (THETA_ALGORITHMS.md §6 "TUNED"). ``skip[a]`` lists the row's top-K indices in
    ascending order followed by −1; those keys read as 0, which always fits and changes nothing.
    """
    row0 = x[rows[0]]
    row1 = x[rows[1]]
    row2 = x[rows[2]]
    row3 = x[rows[3]]
    g0 = targets[0]
    g1 = targets[1]
    g2 = targets[2]
    g3 = targets[3]
    c0 = 0.0
    c1 = 0.0
    c2 = 0.0
    c3 = 0.0
    e0 = np.inf
    e1 = np.inf
    e2 = np.inf
    e3 = np.inf
    k0 = 0
    k1 = 0
    k2 = 0
    k3 = 0
    for i in range(stop):
        v0 = np.float64(row0[i])
        v1 = np.float64(row1[i])
        v2 = np.float64(row2[i])
        v3 = np.float64(row3[i])
        if i == skip[0, k0]:
            v0 = 0.0
            k0 += 1
        if i == skip[1, k1]:
            v1 = 0.0
            k1 += 1
        if i == skip[2, k2]:
            v2 = 0.0
            k2 += 1
        if i == skip[3, k3]:
            v3 = 0.0
            k3 += 1
        t0 = c0 + v0
        t1 = c1 + v1
        t2 = c2 + v2
        t3 = c3 + v3
        f0 = t0 <= g0
        f1 = t1 <= g1
        f2 = t2 <= g2
        f3 = t3 <= g3
        e0 = e0 if f0 else min(e0, v0)
        e1 = e1 if f1 else min(e1, v1)
        e2 = e2 if f2 else min(e2, v2)
        e3 = e3 if f3 else min(e3, v3)
        c0 = t0 if f0 else c0
        c1 = t1 if f1 else c1
        c2 = t2 if f2 else c2
        c3 = t3 if f3 else c3
    out[0] = min(g0 - c0, e0 - (g0 - c0))
    out[1] = min(g1 - c1, e1 - (g1 - c1))
    out[2] = min(g2 - c2, e2 - (g2 - c2))
    out[3] = min(g3 - c3, e3 - (g3 - c3))


@njit(cache=True)
def _interleaved_first_fit(x, r0, pending, n_pending, skip, targets, ends, out_d):
    """One-target first-fit of the block's pending rows, four at a time (short groups repeat a row)."""
    rows = np.empty(4, np.int64)
    quad_skip = np.empty((4, K_SMALL + 1), np.int64)
    quad_targets = np.empty(4)
    quad_out = np.empty(4)
    for start in range(0, n_pending, 4):
        stop = 0
        for a in range(4):
            j = pending[min(start + a, n_pending - 1)]
            rows[a] = r0 + j
            quad_skip[a, :K_SMALL] = skip[j]
            quad_skip[a, K_SMALL] = -1
            quad_targets[a] = targets[j]
            stop = max(stop, ends[j])
        _first_fit_quad(x, rows, quad_skip, quad_targets, stop, quad_out)
        for a in range(min(4, n_pending - start)):
            out_d[start + a] = quad_out[a]


@njit(cache=True)
def _certify_block(
    x, r0, r1, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status,
):  # fmt: skip
    nb = r1 - r0
    top_v = np.empty((ROW_BLOCK, K_SMALL))
    top_i = np.empty((ROW_BLOCK, K_SMALL), np.int64)
    skip = np.empty((ROW_BLOCK, K_SMALL), np.int64)
    sums = np.empty(1 << K_SMALL)
    ns = np.zeros(ROW_BLOCK, np.int64)
    ends = np.zeros(ROW_BLOCK, np.int64)
    qs = np.zeros(ROW_BLOCK)
    targets = np.zeros(ROW_BLOCK)
    pending = np.empty(ROW_BLOCK, np.int64)
    n_pending = 0
    for j in range(nb):
        r = r0 + j
        s, n, pmax, q, end, st = _scan_row(x[r], exact_quantum, top_v[j], top_i[j])
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
        if n <= mitm_max:
            if n > MITM_CHEAP_SUPPORT and e == 0.0:
                # Exact sums: a short CKK search often meets the perfect-partition rule long before the
                # 2^(n/2) meet-in-the-middle would finish.
                vals = np.sort(support_values(x[r], n))[::-1].copy()
                best_diff, outcome = complete_karmarkar_karp(vals, -1.0, q, PERFECT_PROBE_NODES)
                if outcome == CKK_EXHAUSTED or outcome == CKK_PERFECT:
                    d_found[r] = 0.5 * best_diff
                    d_lb[r] = 0.5 * best_diff
                    method[r] = _CKK_PROVED
                    continue
            d = meet_in_the_middle(x[r], n, t)
            d_found[r] = d
            d_lb[r] = d
            method[r] = _MITM
            continue
        if pmax - t > e:
            d_found[r] = pmax - t
            d_lb[r] = pmax - t
            method[r] = _DOMINANT
            continue
        k_small = min(K_SMALL, n)
        tv = top_v[j, :k_small]
        dl, d_end, g = _relaxation(tv, s - tv.sum(), t, sums)
        if dl > e:
            d_found[r] = dl
            d_lb[r] = dl
            method[r] = _K_ATOM
            continue
        d_found[r] = d_end
        d_lb[r] = dl
        targets[j] = g
        skip[j] = np.sort(top_i[j])
        pending[n_pending] = j
        n_pending += 1

    ff_d = np.empty(n_pending)
    _interleaved_first_fit(x, r0, pending, n_pending, skip, targets, ends, ff_d)

    for a in range(n_pending):
        j = pending[a]
        r = r0 + j
        # A negative target means no top-8 subset T has t − p(T) ∈ [0, rest] (0 < d_lb ≤ err): the fill has no
        # subset to extend and its result is meaningless.
        fill_d = ff_d[a] if targets[j] >= 0.0 else np.inf
        d = min(d_found[r], fill_d)
        if _proves_perfect(d, qs[j], err[r]):
            d_found[r] = d
            d_lb[r] = d
            method[r] = _PERFECT
            continue
        if d <= stop_d:
            d_found[r] = d
            method[r] = _FF_ONE
            continue
        k_small = min(K_SMALL, ns[j])
        df, dl, m = _refine_row(
            x[r], ns[j], row_sum[r], qs[j], err[r], ends[j], stop_d, ckk_budget, ckk_max_support,
            top_v[j, :k_small], top_i[j, :k_small], d, d_lb[r],
        )  # fmt: skip
        d_found[r] = df
        d_lb[r] = dl
        method[r] = m


@njit(parallel=True, cache=True)
def certify_rows(
    x, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status,
):  # fmt: skip
    """Run the cascade on every row of ``x`` [row, key] (float32 or float64, C-contiguous), in parallel.

    Args:
        exact_quantum: True for float64 input (the quantum q is the lowest set bit over the row); False when
            the values are float32 numbers (q = 2^(e_min − 24)).
        stop_d: stop refining once the best subset has d ≤ stop_d (2^-13.5 for float32, 2^-28 for float64).
        mitm_max: rows with at most this many non-zeros are solved exactly by meet-in-the-middle.
        ckk_budget, ckk_max_support: node budget of the final CKK stage, and the largest support it runs on.
        check_sum, tolerance: flag rows with |ŝ − 1| > tolerance as BAD_SUM.

    Outputs (one entry per row): ŝ, p_max, d̂ (best subset), d̂_lb (proved: d* ≥ d̂_lb − E), E, method, status.
    The true optimum satisfies d̂_lb − E ≤ d* ≤ d̂ + E.
    """
    n_rows = x.shape[0]
    n_blocks = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    for b in prange(n_blocks):
        r0 = b * ROW_BLOCK
        r1 = min(n_rows, r0 + ROW_BLOCK)
        _certify_block(
            x, r0, r1, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
            row_sum, p_max, d_found, d_lb, err, method, status,
        )  # fmt: skip


@njit(cache=True)
def certify_rows_serial(
    x, exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support, check_sum, tolerance,
    row_sum, p_max, d_found, d_lb, err, method, status,
):  # fmt: skip
    """``certify_rows`` on one thread: small batches, where waking the thread pool costs more than the work."""
    n_rows = x.shape[0]
    for r0 in range(0, n_rows, ROW_BLOCK):
        _certify_block(
            x, r0, min(n_rows, r0 + ROW_BLOCK), exact_quantum, stop_d, mitm_max, ckk_budget, ckk_max_support,
            check_sum, tolerance, row_sum, p_max, d_found, d_lb, err, method, status,
        )  # fmt: skip
