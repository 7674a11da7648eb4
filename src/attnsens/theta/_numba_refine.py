"""Cascade stages shared by every row (top-K relaxation, perfect-partition test) and the refinement stages that
run after the one-target first-fit: 16 targets, Karmarkar–Karp, top-14 relaxation, budgeted CKK
(docs/theta-algorithms.md §3). Distances obey the rounding model of ``_numba_kernels``.
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._constants import K_LARGE, N_TARGETS, SWAP_ROUNDS
from attnsens.theta._numba_cardinality import (
    cardinality_branch_and_bound,
    cardinality_relaxation,
    count_pruned_meet_in_the_middle,
    count_tail_score,
    group_cardinality_bound,
)
from attnsens.theta._numba_four_list import four_list_perfect_split
from attnsens.theta._numba_partition import (
    CKK_EXHAUSTED,
    CKK_PERFECT,
    MULTISET_SIDE,
    MULTISET_SIDE_EXACT,
    complete_karmarkar_karp,
    descending_support,
    karmarkar_karp,
    meet_in_the_middle,
    multiset_split,
    swap_descent,
)
from attnsens.theta._numba_residues import RESIDUE_MODULUS, residue_bound
from attnsens.theta._numba_scan import top_k
from attnsens.theta.methods import ThetaMethod

MITM_FALLBACK_SUPPORT = 32
"""Rows of at most this many keys still open before the budgeted CKK are enumerated instead (≤ 3 ms, exact)."""
SHORT_ROW_SUPPORT = 48
"""Rows of 25–48 keys try the proofs of ``prove_short_row`` before any heuristic; the ones left open go on
through the cascade unless ``mitm_max`` covers them, and are enumerated after all if every stage leaves them
above the stop distance (≤ 1 s at 48 keys; on early-training attention about one row in 20,000), so rows this
short always end at the precision asked."""
REFINE_SEARCH_NODES = 20_000
"""Node budget of the cardinality-pruned search for rows the heuristics leave open (about 0.4 ms)."""
COUNT_MITM_MIN_TAIL = 1.5
"""Rows whose target lies at least this many spreads from the centre of its count's sums take the count-pruned
meet-in-the-middle (``prove_short_row``); nearer the centre it would list every sum."""
LAST_SEARCH_MAX_SUPPORT = 128
LAST_SEARCH_NODES = 200_000
"""Rows of 49–128 keys with error-free sums that every stage leaves above the stop distance get a last
cardinality-pruned search of 200,000 nodes (about 1 ms). Such rows are near-uniform with an odd count: on a
63-key row of the tiny GPT's early attention (values 0.0087–0.0175), exchanges stalled at 1.7·10^-4 and CKK
with 2,000,000 nodes at 3.3·10^-4, while this search reached 5.1·10^-5 within the 8.6·10^-5 stop distance."""
EXACT_FIRST_MAX_SUPPORT = 128
"""Rows of at most this many keys run the stages that can end exact first: no whole-row first-fit
(``_numba_kernels``), Karmarkar–Karp (which often finds a perfect split) before the exchanges, and the
cardinality-pruned search before the top-14 relaxation. Longer rows
take the cheap stages first: there KK's sliding window costs O(n²) moves on near-uniform rows (60 µs at 700
keys, against 4 µs for the exchanges, which settle 98 % of the rows that reach them) and the search can spend its
20,000 nodes (4 ms) on a row the top-14 relaxation proves in 25 µs."""
FREEZE_EVERY = 32
"""First-fits check every this many keys whether their best distance is ≤ the stop distance, and stop if so."""
_INF_BITS = 0x7FF0000000000000
"""+inf as int64 bits: non-negative float64 values compare like these integers."""

_PERFECT = int(ThetaMethod.PERFECT_PARTITION)
_FF_SIXTEEN = int(ThetaMethod.FIRST_FIT_SIXTEEN_TARGETS)
_KK = int(ThetaMethod.KARMARKAR_KARP)
_K_ATOM_14 = int(ThetaMethod.K_ATOM_RELAXATION_14)
_TOP14_ENDPOINT = int(ThetaMethod.TOP14_ENDPOINT)
_SWAP = int(ThetaMethod.SWAP_DESCENT)
_CKK_PROVED = int(ThetaMethod.CKK_PROVED)
_CKK_BUDGET = int(ThetaMethod.CKK_BUDGET)
_CARDINALITY = int(ThetaMethod.CARDINALITY_BOUND)
_SEARCH_PROVED = int(ThetaMethod.CARDINALITY_SEARCH)
_SEARCH_FOUND = int(ThetaMethod.CARDINALITY_SEARCH_BUDGET)
_MITM = int(ThetaMethod.MEET_IN_THE_MIDDLE)
_COUNT_MITM = int(ThetaMethod.COUNT_PRUNED_MITM)
_MULTISET = int(ThetaMethod.MULTISET_SPLIT)
_RESIDUE = int(ThetaMethod.RESIDUE_BOUND)


@cached_njit()
def proves_perfect(d, q, e):
    """With exact sums every 2·d(S) ≡ s/q (mod 2) in units of q, so 2d ≤ q is optimal."""
    return e == 0.0 and 2.0 * d <= q


@cached_njit()
def settled(d, q, e, stop_d, code):
    """The method that ends refinement at distance d, or 0 to go on: PERFECT when 2d ≤ q proves d optimal, else
    ``code`` (the stage that found d) once d ≤ ``stop_d``."""
    if proves_perfect(d, q, e):
        return _PERFECT
    return code if d <= stop_d else 0


@cached_njit()
def _subset_sums_unsorted(top_v, sums):
    """sums[T] = Σ_{k ∈ T} top_v[k] for every bitmask T (doubling)."""
    sums[0] = 0.0
    for k in range(top_v.size):
        step = 1 << k
        for j in range(step):
            sums[step + j] = sums[j] + top_v[k]


@cached_njit()
def relaxation_scratch(k):
    """Work space of ``relaxation`` for K atoms (float64 [5, 2^K]; allocate once per block of rows)."""
    return np.empty((5, 1 << k))


@cached_njit()
def _relaxation_terms(sums, t, rest, half_rest, end_d, lb_d, score):
    """Per subset sum a = p(T): the endpoint distance, the relaxation distance and the target score (all ≥ 0)."""
    for j in range(sums.size):
        a = sums[j]
        lo = a - t
        hi = t - (a + rest)
        end_d[j] = min(abs(lo), abs(hi))
        lb_d[j] = lo if lo > 0.0 else (hi if hi > 0.0 else 0.0)
        score[j] = abs((t - a) - half_rest) if (lo <= 0.0) & (hi <= 0.0) else np.inf


@cached_njit()
def _subset_terms(top_v, t, rest, scratch):
    """Fill ``scratch`` rows 0–3 for every bitmask T of the K atoms: p(T) and its ``_relaxation_terms``; returns 2^K."""
    count = 1 << top_v.size
    _subset_sums_unsorted(top_v, scratch[0, :count])
    _relaxation_terms(scratch[0, :count], t, rest, 0.5 * rest, scratch[1, :count], scratch[2, :count],
                      scratch[3, :count])  # fmt: skip
    return count


@cached_njit()
def _smallest(bits):
    """min of int64 ``bits``: on non-negative float64 values integer order is value order (vectorises)."""
    m = bits[0]
    for j in range(1, bits.size):
        m = min(m, bits[j])
    return m


@cached_njit()
def relaxation(top_v, rest, t, scratch):
    """Top-K relaxation (docs/theta-algorithms.md §1 "K-atom regime").

    Returns (d_lb, d_endpoint, target): d_lb = min_T dist(t, [p(T), p(T) + rest]) ≤ d* (= d* when > 0);
    d_endpoint = the best of the subsets T and T ∪ tail; target = t − p(T) ∈ [0, rest] closest to rest/2 (the
    first such T in bitmask order), −1 when there is none. ``scratch`` comes from ``relaxation_scratch(K)``.
    The per-subset terms are written out and reduced as integers (their float64 values are ≥ 0), so both loops
    vectorise; min is exact, so the order of the reduction changes nothing.
    """
    count = _subset_terms(top_v, t, rest, scratch)
    sums = scratch[0, :count]
    bits = scratch.view(np.int64)
    result = bits[4]
    result[0] = _smallest(bits[1, :count])
    result[1] = _smallest(bits[2, :count])
    best_score = _smallest(bits[3, :count])
    target = -1.0
    if best_score < _INF_BITS:  # some T has t − p(T) ∈ [0, rest]
        for j in range(count):
            if bits[3, j] == best_score:
                target = t - sums[j]
                break
    return scratch[4, 1], scratch[4, 0], target


@cached_njit()
def _best_targets(top_v, rest, t, scratch, out_g):
    """Fill ``out_g`` with the (up to) m = len(out_g) targets t − p(T) ∈ [0, rest] closest to rest/2; return how
    many. Ties go to the first T in bitmask order. ``scratch`` comes from ``relaxation_scratch(K)``.

    The scores are the relaxation's (vectorised, compared as int64 bits). Cut the list of admissible T into m
    runs: the largest of the runs' minima has at least m scores at or below it, so only those few are ranked.
    """
    count = _subset_terms(top_v, t, rest, scratch)
    sums = scratch[0, :count]
    score = scratch.view(np.int64)[3, :count]
    admissible = scratch.view(np.int64)[4, :count]
    n_admissible = 0
    for j in range(count):  # branch-free compaction
        admissible[n_admissible] = j
        n_admissible += score[j] < _INF_BITS
    m = out_g.size
    threshold = _INF_BITS
    if n_admissible > m:
        width = n_admissible // m
        threshold = 0
        for c in range(m):
            low = _INF_BITS
            for i in range(c * width, n_admissible if c == m - 1 else (c + 1) * width):
                low = min(low, score[admissible[i]])
            threshold = max(threshold, low)
    best = np.empty(m, np.int64)
    n_best = 0
    for i in range(n_admissible):
        j = admissible[i]
        sc = score[j]
        if sc <= threshold and (n_best < m or sc < best[m - 1]):
            k = min(n_best, m - 1)
            while k > 0 and best[k - 1] > sc:
                best[k] = best[k - 1]
                out_g[k] = out_g[k - 1]
                k -= 1
            best[k] = sc
            out_g[k] = t - sums[j]
            n_best = min(n_best + 1, m)
    return n_best


@cached_njit()
def _first_fit_targets(row, end, skip_sorted, targets, count, stop_d):
    """First-fit of the tail (original order, ``skip_sorted`` indices left out) into each target capacity.

    Returns the best d over targets: min(gap, e_min − gap) with gap = g − (filled mass) and e_min the smallest
    element that did not fit (its addition overshoots by e_min − gap); the first such best ≤ ``stop_d`` at a
    check every ``FREEZE_EVERY`` keys ends the walk.
    """
    fill = np.zeros(count)
    e_min = np.full(count, np.inf)
    sp = 0
    n_skip = skip_sorted.size
    for i in range(end):
        if i > 0 and i % FREEZE_EVERY == 0 and _best_fill(targets, fill, e_min, count) <= stop_d:
            break
        if sp < n_skip and i == skip_sorted[sp]:
            sp += 1
            continue
        x = np.float64(row[i])
        for m in range(count):  # branch-free: the loop over targets vectorises
            c = fill[m] + x
            fits = c <= targets[m]
            e_min[m] = e_min[m] if fits else min(e_min[m], x)
            fill[m] = c if fits else fill[m]
    return _best_fill(targets, fill, e_min, count)


@cached_njit()
def _best_fill(targets, fill, e_min, count):
    best = np.inf
    for m in range(count):
        gap = targets[m] - fill[m]
        best = min(best, gap, e_min[m] - gap)
    return best


@cached_njit()
def refine_row(
    row, bits, n, s, q, e, end, stop_d, ckk_budget, ckk_max_support, top_v, skip_sorted, scratch, d_found, d_lb,
    workspace,
):  # fmt: skip
    """Stages after the one-target first-fit: 16 targets, cardinality bound, KK and the greedy split with best
    exchanges, the cardinality-pruned search (error-free sums only) and the top-14 relaxation (each pair in the
    order of ``EXACT_FIRST_MAX_SUPPORT``), the exact split over the copies of a few repeated values
    (``multiset_split``), then meet-in-the-middle (≤ 32 keys) or
    the four-list search for a perfect split (rows of more than 48 keys) and budgeted CKK, and meet-in-the-middle
    after all for rows of ≤ 48 keys CKK leaves above the stop distance. ``bits`` is the row as signed integers
    (``scan_row``), ``skip_sorted`` the top-K indices in ascending order, ``scratch`` from ``relaxation_scratch(K)``,
    ``workspace`` the enumeration's buffers (``mitm_workspace``; new ones where it is too small).

    Returns (d_found, d_lb, method).
    """
    t = 0.5 * s
    targets = np.empty(N_TARGETS)
    count = _best_targets(top_v, s - top_v.sum(), t, scratch, targets)
    if count > 0:
        d_found = min(d_found, _first_fit_targets(row, end, skip_sorted, targets, count, stop_d))
    stage = settled(d_found, q, e, stop_d, _FF_SIXTEEN)
    if stage:
        return d_found, d_found if stage == _PERFECT else d_lb, stage

    vals = descending_support(row, n)  # shared by the cardinality bound, KK, exchanges and CKK
    d_card, _ = cardinality_relaxation(vals, top_v.size, t)
    if d_card > e:
        return d_card, d_card, _CARDINALITY
    d_lb = max(d_lb, d_card)

    exact_first = n <= EXACT_FIRST_MAX_SUPPORT
    for attempt in range(2):
        if (attempt == 0) == exact_first:
            d_found = min(d_found, karmarkar_karp(vals))
            code = _KK
        else:
            d_found = min(d_found, swap_descent(vals, t, stop_d, SWAP_ROUNDS))
            code = _SWAP
        stage = settled(d_found, q, e, stop_d, code)
        if stage:
            return d_found, d_found if stage == _PERFECT else d_lb, stage

    for attempt in range(2):
        if (attempt == 0) != exact_first:
            k_large = min(K_LARGE, n)
            top14_v = np.empty(k_large)
            top_k(row, bits, 1, 0, end, top14_v, np.empty(k_large, np.int64))  # every positive entry is a candidate
            d_lb14, d_end14, _ = relaxation(top14_v, s - top14_v.sum(), t, relaxation_scratch(k_large))
            d_found = min(d_found, d_end14)
            if d_lb14 > e:
                return d_lb14, d_lb14, _K_ATOM_14
            d_lb = max(d_lb, d_lb14)
            if d_found <= stop_d:
                return d_found, d_lb, _TOP14_ENDPOINT
        elif e == 0.0:  # near-uniform rows with an odd count: the few good splits lie at an end of a count's interval
            d_search, proved = cardinality_branch_and_bound(vals, t, q, REFINE_SEARCH_NODES)
            if proved:
                return d_search, d_search, _SEARCH_PROVED
            d_found = min(d_found, d_search)
            if d_found <= stop_d:
                return d_found, d_lb, _SEARCH_FOUND

    if e == 0.0:  # a few repeated values: exact over how many copies of each the subset holds
        d, proved = multiset_split(vals, t, MULTISET_SIDE if stop_d >= 0.0 else MULTISET_SIDE_EXACT)
        if proved:
            return d, d, _MULTISET
    if n <= MITM_FALLBACK_SUPPORT:  # the rare short row every heuristic leaves open: enumerate it
        d = meet_in_the_middle(row, n, t, e, d_found, workspace)
        return d, d, _MITM
    if e == 0.0 and n > SHORT_ROW_SUPPORT:  # shorter rows tried it in prove_short_row; these nearly always have a split
        d = four_list_perfect_split(vals, q)
        if proves_perfect(d, q, e):
            return d, d, _PERFECT
    if n > ckk_max_support:
        return d_found, d_lb, _CKK_BUDGET
    quantum_diff = q if e == 0.0 else -1.0
    best_diff, outcome = complete_karmarkar_karp(vals, 2.0 * stop_d, quantum_diff, ckk_budget)
    d_found = min(d_found, 0.5 * best_diff)
    if outcome == CKK_EXHAUSTED or outcome == CKK_PERFECT:
        return 0.5 * best_diff, 0.5 * best_diff, _CKK_PROVED
    if d_found > stop_d and n <= SHORT_ROW_SUPPORT:  # would stay wider than asked: enumerate it after all
        d = meet_in_the_middle(row, n, t, e, d_found, workspace)
        return d, d, _MITM
    if d_found > stop_d and e == 0.0 and n <= LAST_SEARCH_MAX_SUPPORT:
        # Near-uniform rows with an odd count where exchanges and CKK stall: a longer cardinality-pruned search.
        d_search, proved = cardinality_branch_and_bound(vals, t, q, LAST_SEARCH_NODES)
        if proved:
            return d_search, d_search, _SEARCH_PROVED
        if d_search <= stop_d:
            return d_search, d_lb, _SEARCH_FOUND
        d_found = min(d_found, d_search)
    return d_found, d_lb, _CKK_BUDGET


@cached_njit()
def prove_short_row(row, n, t, q, e, k_top, probe_nodes, search_nodes, four_list_work):
    """The proofs that settle most rows too long for a cheap meet-in-the-middle without enumerating them all: the
    cardinality bound and its three-group form, then (sums error-free) a perfect split found by the four-list
    search or a CKK search of ``probe_nodes`` nodes (which also proves an optimum by exhausting its tree), and
    last the count-pruned meet-in-the-middle within ``search_nodes`` nodes. ``four_list_work`` caps the pair sums
    of the four-list search (``four_list_perfect_split``'s ``long_work``).

    Returns (d*, method), or (∞, 0) when none applies and the row needs the full meet-in-the-middle.
    """
    vals = descending_support(row, n)
    d_card, d_card_end = cardinality_relaxation(vals, k_top, t)
    if d_card > e:
        return d_card, _CARDINALITY
    d_group, d_group_end = group_cardinality_bound(vals, t)
    if d_group > e:
        return d_group, _CARDINALITY
    if e == 0.0:
        d_known = min(d_card_end, d_group_end)  # each the distance of a real subset
        d_residue, n_reached = residue_bound(vals, q)
        if 2.0 * d_residue > q:
            # No split is perfect, and a subset at the bound is optimal: the four-list search looks for one. Subset
            # sums crowd into the reached residues, so a target there has 64/reached times the splits its
            # estimate counts (on SmolLM2's, the causal and the tiny GPT's rows of 25–48 keys: 82.5, 87.7 and 89.1
            # → 82.9, 89.1 and 89.1 % exact at 41–48 keys, at the same time within the machine's spread).
            if d_known <= d_residue:
                return d_known, _RESIDUE
            gap = np.int64(2.0 * d_residue / q)
            crowding = RESIDUE_MODULUS / n_reached
            if four_list_perfect_split(vals, q, four_list_work, gap, crowding) <= d_residue:
                return d_residue, _RESIDUE
            best_diff, outcome = complete_karmarkar_karp(vals, -1.0, 2.0 * d_residue, probe_nodes)
            if outcome == CKK_PERFECT:  # 2d* ≤ best_diff ≤ 2·d_residue ≤ 2d*
                return 0.5 * best_diff, _RESIDUE
        else:
            # The four-list search first: on the tiny GPT's short rows it finds the perfect splits the CKK probe
            # would (and 8 times as many), and the probe then runs only on the rows it leaves. The two stages on
            # those 8,524 rows: 0.31 → 0.28 s; the tensor 0.53 → 0.49–0.51 s (alternating runs), the same values.
            d = four_list_perfect_split(vals, q, four_list_work)
            if proves_perfect(d, q, e):
                return d, _PERFECT
            best_diff, outcome = complete_karmarkar_karp(vals, -1.0, q, probe_nodes)
        if outcome == CKK_EXHAUSTED or outcome == CKK_PERFECT:
            return 0.5 * best_diff, _CKK_PROVED
        if count_tail_score(vals, t) >= COUNT_MITM_MIN_TAIL:
            d_known = min(d_known, 0.5 * best_diff)
            d, proved = count_pruned_meet_in_the_middle(vals, t, d_known, search_nodes)
            if proved:
                return d, _COUNT_MITM
    return np.inf, 0
