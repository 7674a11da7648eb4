"""Enumeration of subset sums for the θ cascade's exact stages (docs/theta-algorithms.md §5), as numba functions.

Sorted lists of subset sums built by merge-doubling, the closest pair of two such lists to a target, and the
pruned meet-in-the-middle that lists, of the larger values' subsets, only the sums that can still come within a
known distance of the target. Sums are float64 and exact when the row's sums are error-free (E = 0); otherwise each
is within E of the real sum it describes (the rounding model of ``_numba_kernels``).
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit

PRUNED_HEAD_RATIO = 2
"""The pruned meet-in-the-middle adds a value to its head list while that list, times this, is at most the size
of the full list of the values left (``pruned_meet_in_the_middle``); at least 1, for the workspace's bound. On
SmolLM2's open rows of 25–40 keys, 1 and 4 took 7–8 % and 2–4 % longer than 2, and 8, 16 and 32 took 1.2, 1.5 and
2.1 times as long."""


@cached_njit()
def _merge_split(sums, size, v):
    """How many of the ``size`` smallest values of the merge of the ascending ``sums[:size]`` (L) and L + v come
    from L: the least i with L[i] ≥ L[size − i − 1] + v (bisection), so that no value left out is below one kept."""
    lo = 0
    hi = size
    while lo < hi:
        i = (lo + hi) // 2
        if sums[i] < sums[size - i - 1] + v:
            lo = i + 1
        else:
            hi = i
    return lo


@cached_njit()
def _sorted_subset_sums(vals):
    """All 2^m subset sums of ``vals`` in ascending order (``_sorted_subset_sums_into`` on new buffers)."""
    size_all = 1 << vals.size
    return _sorted_subset_sums_into(vals, np.empty(size_all), np.empty(size_all))


@cached_njit()
def _sorted_subset_sums_into(vals, out, tmp):
    """All 2^m subset sums of ``vals`` in ascending order, by merge-doubling (no sort, O(2^m)), in the buffers
    ``out`` and ``tmp`` (each of at least 2^m values); returns the first 2^m values of the one that holds them.

    Each doubling merges the sorted list L with L + v. A branch-free merge step waits on its own loads, so the
    merge runs as four independent chains in one loop: from the front (the smaller head, L's on ties), from the
    back (the larger tail, L + v's on ties), and outward from the middle, where ``_merge_split`` tells how the
    ``size`` smallest values divide between L and L + v: one chain down from there and one up, each told by its
    indices when one list is spent. Each chain writes ``size / 2`` values, the merged list as a one-ended merge
    would write it (a sorted list of the same values is unique); the first doubling, of a one-value list, is
    written directly. Two chains ran in about 0.6× the time of one; four in 0.74× that of two at 2^12–2^16 sums.
    """
    size_all = 1 << vals.size
    out[0] = 0.0
    size = 1
    for v in vals:
        if size == 1:
            b = out[0] + v
            tmp[0] = out[0] if out[0] <= b else b
            tmp[1] = out[0] if out[0] > b else b
        else:
            from_l = _merge_split(out, size, v)
            i = 0  # front heads of L and L + v (i + j = k < size / 2 at every read)
            j = 0
            i_down = from_l - 1  # tails of the size smallest values (−1: that list gave none)
            j_down = size - from_l - 1
            i_up = from_l  # heads of the rest (size: that list is spent)
            j_up = size - from_l
            i_back = size - 1  # back tails
            j_back = size - 1
            top = size - 1
            last = 2 * size - 1
            for k in range(size // 2):
                a = out[i]
                b = out[j] + v
                take_a = a <= b  # branch-free: which list advances is data, not control flow
                tmp[k] = a if take_a else b
                i += take_a
                j += not take_a
                a = out[max(i_down, 0)]
                b = out[max(j_down, 0)] + v
                take_a = ((a > b) & (i_down >= 0)) | (j_down < 0)
                tmp[top - k] = a if take_a else b
                i_down -= take_a
                j_down -= not take_a
                a = out[min(i_up, top)]
                b = out[min(j_up, top)] + v
                take_a = ((a <= b) & (i_up < size)) | (j_up >= size)
                tmp[size + k] = a if take_a else b
                i_up += take_a
                j_up += not take_a
                a = out[i_back]
                b = out[j_back] + v
                take_a = a > b
                tmp[last - k] = a if take_a else b
                i_back -= take_a
                j_back -= not take_a
        out, tmp = tmp, out
        size *= 2
    return out[:size_all]


@cached_njit()
def _closest_pair_sweep(a, b, t, i, i_end, j):
    """min |x + y − t| over x in a[i:i_end] and y in b (both sorted ascending), by one two-pointer sweep from
    (i, j): a ascending, b descending; 0 as soon as a pair meets t. j must be at or above b's crossing for a[i]
    (``_crossing``): every later x has its crossing at or below it, and the sweep visits each x's crossing, where
    |x + y − t| is least."""
    best = np.inf
    while i < i_end and j >= 0:
        v = (a[i] + b[j]) - t
        if v == 0.0:
            return 0.0
        below = v < 0.0  # branch-free: which pointer moves is data, not control flow
        best = min(best, abs(v))
        i += below
        j -= not below
    return best


@cached_njit()
def _crossing(x, b, t):
    """The first index j of the ascending ``b`` with (x + b[j]) − t ≥ 0, or the last index when there is none."""
    lo = 0
    hi = b.size - 1
    if (x + b[hi]) - t < 0.0:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if (x + b[mid]) - t >= 0.0:
            hi = mid
        else:
            lo = mid + 1
    return lo


SWEEP_LANES_MIN = 64
"""Lists of ``a`` shorter than this take one sweep: four lanes would save less than their setup."""


@cached_njit()
def _closest_pair_sum(a, b, t):
    """min |x + y − t| over x in ``a`` and y in ``b`` (both sorted ascending); 0 as soon as a pair meets t.

    One two-pointer sweep (``_closest_pair_sweep``) is a chain of loads that each wait on the step before. Here
    ``a`` is cut into four quarters, each swept from its own start (b's crossing for the quarter's first value,
    by bisection), and the four sweeps advance side by side in one loop: four independent chains, so the
    processor overlaps their loads. Each quarter's sweep visits the crossing of each of its values, so the
    minimum is the one sweep's, the same float64 differences compared (bit for bit). At 2^12–2^16 sums a list
    it takes about half the time of one sweep.
    """
    if a.size < SWEEP_LANES_MIN:
        return _closest_pair_sweep(a, b, t, 0, a.size, b.size - 1)
    quarter = a.size // 4
    i0, i1, i2, i3 = 0, quarter, 2 * quarter, 3 * quarter
    e0, e1, e2, e3 = quarter, 2 * quarter, 3 * quarter, a.size
    j0 = b.size - 1
    j1 = _crossing(a[i1], b, t)
    j2 = _crossing(a[i2], b, t)
    j3 = _crossing(a[i3], b, t)
    best = np.inf
    while True:
        live0 = (i0 < e0) & (j0 >= 0)
        live1 = (i1 < e1) & (j1 >= 0)
        live2 = (i2 < e2) & (j2 >= 0)
        live3 = (i3 < e3) & (j3 >= 0)
        if not (live0 | live1 | live2 | live3):
            return best
        # A finished lane reads its last pair again (indices clamped) and moves no more.
        v0 = (a[min(i0, e0 - 1)] + b[max(j0, 0)]) - t
        v1 = (a[min(i1, e1 - 1)] + b[max(j1, 0)]) - t
        v2 = (a[min(i2, e2 - 1)] + b[max(j2, 0)]) - t
        v3 = (a[min(i3, e3 - 1)] + b[max(j3, 0)]) - t
        if (live0 & (v0 == 0.0)) | (live1 & (v1 == 0.0)) | (live2 & (v2 == 0.0)) | (live3 & (v3 == 0.0)):
            return 0.0
        best = min(
            best,
            abs(v0) if live0 else np.inf,
            abs(v1) if live1 else np.inf,
            abs(v2) if live2 else np.inf,
            abs(v3) if live3 else np.inf,
        )
        below0 = v0 < 0.0
        below1 = v1 < 0.0
        below2 = v2 < 0.0
        below3 = v3 < 0.0
        i0 += live0 & below0
        j0 -= live0 & (not below0)
        i1 += live1 & below1
        j1 -= live1 & (not below1)
        i2 += live2 & below2
        j2 -= live2 & (not below2)
        i3 += live3 & below3
        j3 -= live3 & (not below3)


@cached_njit()
def mitm_workspace(n):
    """Buffers for ``pruned_meet_in_the_middle`` on rows of up to n non-zeros: four lists of 2^⌈n/2⌉ float64 values
    (0.5 GiB at 48), untouched until used."""
    return np.empty((4, 1 << (n - n // 2)))


@cached_njit()
def _first_at_least(a, lo, hi, x):
    """The first index in [lo, hi) of the ascending ``a`` with a[i] ≥ x (hi when there is none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cached_njit()
def _first_above(a, lo, hi, x):
    """The first index in [lo, hi) of the ascending ``a`` with a[i] > x (hi when there is none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cached_njit()
def _merge_window(src, size, v, lo, hi, dst):
    """Writes to ``dst``, ascending, the values of L and L + v that lie in [lo, hi], L the ascending ``src[:size]``;
    returns how many.

    Both ranges are found by bisection and merged as two branch-free chains, from the front (L's value on ties)
    and from the back (L + v's on ties), each writing half of them: the merge of the two ranges, written from both
    ends (0.8× the time of one branching merge here).
    """
    a0 = _first_at_least(src, 0, size, lo)
    a1 = _first_above(src, a0, size, hi)
    b0 = _first_at_least(src, 0, size, lo - v)
    b1 = _first_above(src, b0, size, hi - v)
    m = (a1 - a0) + (b1 - b0)
    if a1 == a0 or b1 == b0:
        for k in range(a1 - a0):
            dst[k] = src[a0 + k]
        for k in range(b1 - b0):
            dst[k] = src[b0 + k] + v
        return m
    i = a0
    j = b0
    i_back = a1 - 1
    j_back = b1 - 1
    last = m - 1
    for k in range((m + 1) // 2):  # on an odd count the front chain also writes the middle value
        a = src[min(i, a1 - 1)]  # a spent range reads its last value again and is never taken
        b = src[min(j, b1 - 1)] + v
        take_a = (i < a1) & ((j >= b1) | (a <= b))
        dst[k] = a if take_a else b
        i += take_a
        j += not take_a
        if k < m // 2:
            a = src[max(i_back, a0)]
            b = src[max(j_back, b0)] + v
            take_a = (i_back >= a0) & ((j_back < b0) | (a > b))
            dst[last - k] = a if take_a else b
            i_back -= take_a
            j_back -= not take_a
    return m


@cached_njit()
def pruned_meet_in_the_middle(vals_desc, t, d_known, margin, workspace):
    """min(d_known, min_S |p(S) − t|) over the subsets S of ``vals_desc`` (non-negative, descending), where
    ``d_known`` is the distance of a real subset and ``margin`` ≥ twice the error bound of a computed sum (0 when
    the sums are error-free); the lists are built in ``workspace`` (``mitm_workspace(vals_desc.size)`` or larger).

    S and its complement are equally far from t, so S holds the largest value. The head list grows value by value,
    largest first: after the k-th value it holds the sums x of the chosen subsets of the first k values that can
    still end within d_known of t, t − w − R_k ≤ x ≤ t + w (w = d_known + margin, R_k the sum of the values after
    the k-th), each level one windowed merge of the level before (``_merge_window``). It grows while
    ``PRUNED_HEAD_RATIO`` times its size is at most 2^(n − k), the full list of the values left; that list is
    built by merge-doubling, and one sweep (``_closest_pair_sum``) finds the closest pair. A subset left out of
    the head list is farther than d_known from t (with the margin, in real numbers too), so the result is d*
    whenever d* < d_known, and d_known otherwise.

    With no pruning this is meet-in-the-middle over n − 1 values. On rows whose values span many binades (a few
    large keys and a long tail of small ones) R_k falls fast: on SmolLM2's rows of 25–40 keys that the proofs
    leave open it took 0.13–0.2× the time of meet-in-the-middle, on the tiny GPT's near-uniform rows 0.66–0.75×.
    """
    n = vals_desc.size
    if n == 0:
        return min(d_known, abs(t))
    rest = np.empty(n + 1)  # rest[k] = the sum of vals_desc[k:]
    rest[n] = 0.0
    for i in range(n - 1, -1, -1):
        rest[i] = rest[i + 1] + vals_desc[i]
    w = d_known + margin
    head = workspace[0]
    spare = workspace[1]
    head[0] = vals_desc[0]
    size = 1
    k = 1
    # The head after k values holds at most 2^(k − 1) sums, so up to k = ⌊n/2⌋ + 1 at most 2^⌊n/2⌋; a step from
    # k > ⌊n/2⌋ is taken only at most 2^(n − k) / PRUNED_HEAD_RATIO sums and doubles them at most, to 2^⌈n/2⌉ with
    # the ratio ≥ 1. Both fit the workspace's 2^⌈n/2⌉, as does the list of the n − k ≤ ⌈n/2⌉ values left.
    while k < n and (k < n // 2 or PRUNED_HEAD_RATIO * size <= 1 << (n - k)):
        size = _merge_window(head, size, vals_desc[k], t - w - rest[k + 1], t + w, spare)
        head, spare = spare, head
        k += 1
        if size == 0:
            return d_known
    tail = _sorted_subset_sums_into(vals_desc[k:], workspace[2], workspace[3])
    return min(d_known, _closest_pair_sum(head[:size], tail, t))
