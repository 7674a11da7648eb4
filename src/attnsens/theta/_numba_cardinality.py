"""The cardinality arguments of the θ cascade (docs/theta-algorithms.md §3 step 4), as numba functions: the
cardinality bound and its three-group form, the cardinality-pruned search, and the count-pruned meet-in-the-middle.

Subsets of k keys have sums between the k smallest and the k largest values; where no count can reach s/2 the
nearest endpoint is optimal, and where few counts can, the searches list only their sums. Distances follow the
rounding model of ``_numba_kernels``: each is within E of the real distance of the subset it describes.
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._numba_enumeration import _closest_pair_sum

LIST_START = 1 << 12
"""First buffer size of each half's list in ``count_pruned_meet_in_the_middle`` (doubled as needed)."""


@cached_njit()
def cardinality_relaxation(vals_desc, k_top, t):
    """Lower bound on d* from the top-K atoms and the number of other keys in S; returns (d_lb, d_endpoint).

    With T ⊆ the K largest values and U a set of k of the other m values, p(T ∪ U) lies in
    [p(T) + L_k, p(T) + U_k], L_k / U_k the sums of the k smallest / largest others. Both ends rise with k, so
    the count nearest g = t − p(T) is the largest k with L_k ≤ g: either U_k ≥ g (the interval holds t) or the
    distance is min(g − U_k, L_(k+1) − g). d_lb is the least distance over every T. When d_lb > 0 no interval
    holds t and the nearest endpoint is a real subset, so d* = d_lb. d_endpoint is the best endpoint met (a
    real subset's distance either way). Every distance is t − p(T) minus one prefix sum of the sorted values:
    the rounding model of ``_numba_kernels``. On near-uniform rows with an odd count only the two middle counts
    come close to t and neither reaches it, so this proves the optimum where no split is perfect.
    """
    n = vals_desc.size
    k_top = min(k_top, n)
    m = n - k_top
    largest = np.empty(m + 1)
    smallest = np.empty(m + 1)
    largest[0] = 0.0
    smallest[0] = 0.0
    for k in range(m):
        largest[k + 1] = largest[k] + vals_desc[k_top + k]
        smallest[k + 1] = smallest[k] + vals_desc[n - 1 - k]
    sums = np.empty(1 << k_top)
    sums[0] = 0.0
    for k in range(k_top):
        step = 1 << k
        for j in range(step):
            sums[step + j] = sums[j] + vals_desc[k]
    d_lb = np.inf
    d_end = np.inf
    for a in sums:
        g = t - a
        if g <= 0.0:  # T alone already reaches t: every other key moves p(S) further away
            d_lb = min(d_lb, -g)
            d_end = min(d_end, -g)
            continue
        lo = 0
        hi = m
        while lo < hi:  # the largest k with L_k ≤ g (L_0 = 0 ≤ g)
            mid = (lo + hi + 1) // 2
            if smallest[mid] <= g:
                lo = mid
            else:
                hi = mid - 1
        below = g - largest[lo]
        above = smallest[lo + 1] - g if lo < m else np.inf
        d_end = min(d_end, min(abs(below), above))
        d_lb = min(d_lb, min(below, above) if below > 0.0 else 0.0)
    return d_lb, d_end


@cached_njit()
def _suffix_distance(prefix, low_sum, n, i, g, start):
    """(bound, endpoint, k): the least distance from g to [L_k, U_k] over the counts k of values[i:] (sorted
    descending, ``prefix`` their prefix sums; L_k / U_k the sums of the k smallest / largest), the distance from g
    to the nearest endpoint met (the sum of a real subset of values[i:]), and the largest count k with L_k ≤ g
    (0 when g ≤ 0).

    L_k = ``low_sum[k]`` (the k smallest of all the values: the same for every suffix that holds k of them) rises
    with k, so that count is found by walking from ``start``: a child in the search moves it by a step or two on
    near-uniform rows, where bisection took log₂ of the count each time."""
    if g <= 0.0:
        return -g, -g, 0
    m = n - i
    k = min(start, m)
    while k < m and low_sum[k + 1] <= g:
        k += 1
    while k > 0 and low_sum[k] > g:
        k -= 1
    below = g - (prefix[i + k] - prefix[i])
    above = low_sum[k + 1] - g if k < m else np.inf
    return (min(below, above) if below > 0.0 else 0.0), min(abs(below), above), k


@cached_njit()
def cardinality_branch_and_bound(vals_desc, t, quantum, budget):
    """Exact d* by depth-first search over the values (descending: in S or not), pruned by the cardinality bound
    of the values not yet placed; returns (d, proved).

    A node with placed mass σ at value i is cut when every count of the remaining values keeps σ + their sum at
    least the best distance found from t (``_suffix_distance``). On near-uniform rows the sums of each count
    form narrow intervals with gaps between them, so the few subsets near t lie at an end of one interval and
    the search reaches them in few nodes. Stops with proved = True when the tree is exhausted or the best
    distance d satisfies 2d ≤ ``quantum`` (the perfect-partition rule; pass −1 when sums are not error-free),
    with False after ``budget`` nodes. Prefix sums and their differences are exact only with error-free sums,
    so callers use it only then.
    """
    n = vals_desc.size
    prefix = _prefix_sums(vals_desc)
    low_sum = np.empty(n + 1)  # low_sum[k]: the sum of the k smallest values
    for k in range(n + 1):
        low_sum[k] = prefix[n] - prefix[n - k]
    mass = np.zeros(n + 1)
    count = np.zeros(n + 1, np.int64)  # each depth's count k (``_suffix_distance``), where its children's walks start
    stage = np.zeros(n + 1, np.int8)  # 0: new node, 1: first child done, 2: both done
    take_first = np.zeros(n + 1, np.bool_)
    best = np.inf
    nodes = 0
    depth = 0
    while depth >= 0:
        if stage[depth] == 0:
            if nodes >= budget:
                return best, False
            nodes += 1
            g = t - mass[depth]
            if depth == n:
                best = min(best, abs(g))
                if 2.0 * best <= quantum:
                    return best, True
                depth -= 1
                continue
            bound, endpoint, count[depth] = _suffix_distance(prefix, low_sum, n, depth, g, count[max(depth - 1, 0)])
            best = min(best, endpoint)
            if 2.0 * best <= quantum:
                return best, True
            if bound >= best:
                depth -= 1
                continue
            take_first[depth] = g > 0.5 * vals_desc[depth]
        if stage[depth] == 2:
            stage[depth] = 0
            depth -= 1
            continue
        take = take_first[depth] if stage[depth] == 0 else not take_first[depth]
        stage[depth] += 1
        mass[depth + 1] = mass[depth] + vals_desc[depth] if take else mass[depth]
        stage[depth + 1] = 0
        depth += 1
    return best, True


@cached_njit()
def _sums_of_count(vals_desc, prefix, count, lo, hi, out, budget):
    """The sums in [lo, hi] of the subsets of exactly ``count`` of ``vals_desc`` (descending; ``prefix`` their
    prefix sums), written to ``out``; returns (how many, nodes visited), or (−1, nodes) when ``out`` is full or the
    ``budget`` of nodes is spent.

    Depth-first over the values (in, then out), every branch cut when its remaining picks cannot bring the sum into
    [lo, hi]: the r largest of the values left add prefix[i + r] − prefix[i], the r smallest prefix[m] − prefix[m −
    r]. Only for error-free sums (every prefix difference exact)."""
    m = vals_desc.size
    picked = np.zeros(m + 1, np.int64)
    mass = np.zeros(m + 1)
    stage = np.zeros(m + 1, np.int8)
    found = 0
    nodes = 0
    depth = 0
    while depth >= 0:
        if stage[depth] == 0:
            nodes += 1
            if nodes > budget:
                return -1, nodes
            r = count - picked[depth]
            if r == 0:
                if lo <= mass[depth] <= hi:
                    if found == out.size:
                        return -1, nodes
                    out[found] = mass[depth]
                    found += 1
                depth -= 1
                continue
            if (
                r > m - depth
                or mass[depth] + (prefix[depth + r] - prefix[depth]) < lo
                or mass[depth] + (prefix[m] - prefix[m - r]) > hi
            ):
                depth -= 1
                continue
        if stage[depth] == 2:
            stage[depth] = 0
            depth -= 1
            continue
        take = stage[depth] == 0
        stage[depth] += 1
        picked[depth + 1] = picked[depth] + (1 if take else 0)
        mass[depth + 1] = mass[depth] + vals_desc[depth] if take else mass[depth]
        stage[depth + 1] = 0
        depth += 1
    return found, nodes


@cached_njit()
def _listed_sums(vals_desc, prefix, count, lo, hi, buffer, budget):
    """``_sums_of_count`` into ``buffer``, listed again into one twice the size while it outgrows it; returns
    (how many, nodes visited over every attempt, the buffer holding them), how many −1 when ``budget`` is spent."""
    nodes = 0
    while True:
        found, used = _sums_of_count(vals_desc, prefix, count, lo, hi, buffer, budget - nodes)
        nodes += used
        if found >= 0 or nodes >= budget:
            return found, nodes, buffer
        buffer = np.empty(2 * buffer.size)


@cached_njit()
def _prefix_sums(values):
    """prefix[i] = values[0] + … + values[i − 1], i = 0 … len(values)."""
    prefix = np.zeros(values.size + 1)
    for i in range(values.size):
        prefix[i + 1] = prefix[i] + values[i]
    return prefix


@cached_njit()
def count_tail_score(vals_desc, t):
    """How far t lies in the tail of the subset sums of the count nearest it: min over k of |t − k·μ| / σ_k, with
    μ the mean value and σ_k the spread of the sums of k values drawn without replacement. Large (≳ 2) on
    near-uniform rows with an odd count, where ``count_pruned_meet_in_the_middle`` lists few sums; near 0 where t
    is the centre of a count and it would list them all."""
    mean, sigma = _count_spreads(vals_desc)
    best = np.inf
    for k in range(1, vals_desc.size):
        best = min(best, abs(t - k * mean) / sigma[k] if sigma[k] > 0.0 else np.inf)
    return best


@cached_njit()
def _count_spreads(values):
    """(μ, σ): the mean of ``values`` and, for k = 1 … m − 1, σ[k] the spread of the sum of k of them drawn without
    replacement, σ_k² = k(m − k)/m · Var (the sample variance); σ[0] = 0."""
    m = values.size
    total = 0.0
    for v in values:
        total += float(v)
    mean = total / m
    spread = 0.0
    for v in values:
        spread += (float(v) - mean) * (float(v) - mean)
    variance = spread / max(m - 1, 1)
    sigma = np.zeros(m)
    for k in range(1, m):
        sigma[k] = np.sqrt(k * (m - k) / m * variance)
    return mean, sigma


@cached_njit()
def count_pruned_meet_in_the_middle(vals_desc, t, d_found, budget):
    """Exact d* by meet-in-the-middle over the subset counts that can reach t, each half's sums pruned to those
    that can still pair within d_found of t; returns (d, proved).

    Only counts k whose interval [L_k, U_k] (the sums of the k smallest / largest values) comes within d of t can
    hold a subset that beats ``d_found`` (the distance of a real subset, so d* ≤ d_found), and a set of count k and
    its complement (count n − k) are equally far from t = s/2, so the counts k ≤ n/2 suffice. The values, sorted,
    are dealt alternately into halves A and B; a subset with j values of A and k − j of B pairs a sum x of A with
    a sum y of B, and x must lie in [t − d − U^B_(k−j), t + d − L^B_(k−j)] (and y likewise), so each half lists
    only such sums (``_sums_of_count``), and one sweep of the two sorted lists finds the closest pair. Every subset
    within d of t is some such pair, so the least distance found, or d_found, is d*.

    Where t lies in the tail of its counts' sums (near-uniform rows with an odd count and no perfect split, which
    the cardinality bound cannot settle), the lists hold a few hundred sums instead of the 2^(n/2) of plain
    meet-in-the-middle. Where t is at the centre of a count (even counts) nothing is pruned and the lists are
    that size; ``budget`` caps the search nodes over all lists (proved is False when it runs out). Only for
    error-free sums: every sum, bound and difference is then exact.
    """
    n = vals_desc.size
    d = d_found
    half_a = vals_desc[0::2].copy()
    half_b = vals_desc[1::2].copy()
    m_a = half_a.size
    m_b = half_b.size
    prefix = _prefix_sums(vals_desc)
    prefix_a = _prefix_sums(half_a)
    prefix_b = _prefix_sums(half_b)
    largest_list = 1 << max(m_a, m_b)
    list_a = np.empty(min(largest_list, LIST_START))
    list_b = np.empty(min(largest_list, LIST_START))
    nodes = 0
    for k in range(n // 2 + 1):
        if (prefix[n] - prefix[n - k]) > t + d or prefix[k] < t - d:  # [L_k, U_k] misses [t − d, t + d]
            continue  # (as does [L_(n−k), U_(n−k)] = [s − U_k, s − L_k]: s = 2t)
        for j in range(max(0, k - m_b), min(k, m_a) + 1):
            c = k - j
            low_b, high_b = prefix_b[m_b] - prefix_b[m_b - c], prefix_b[c]
            low_a, high_a = prefix_a[m_a] - prefix_a[m_a - j], prefix_a[j]
            if low_a + low_b > t + d or high_a + high_b < t - d:
                continue
            found_a, used, list_a = _listed_sums(half_a, prefix_a, j, t - d - high_b, t + d - low_b, list_a,
                                                 budget - nodes)  # fmt: skip
            nodes += used
            if found_a < 0:
                return d, False
            if found_a == 0:
                continue
            found_b, used, list_b = _listed_sums(half_b, prefix_b, c, t - d - high_a, t + d - low_a, list_b,
                                                 budget - nodes)  # fmt: skip
            nodes += used
            if found_b < 0:
                return d, False
            if found_b == 0:
                continue
            d = min(d, _closest_pair_sum(np.sort(list_a[:found_a]), np.sort(list_b[:found_b]), t))
    return d, True


@cached_njit()
def _group_prefixes(vals_desc, lo, hi):
    """(smallest, largest): sums of the k smallest / largest of vals_desc[lo:hi], k = 0 … hi − lo."""
    m = hi - lo
    smallest = np.zeros(m + 1)
    largest = np.zeros(m + 1)
    for k in range(m):
        largest[k + 1] = largest[k] + vals_desc[lo + k]
        smallest[k + 1] = smallest[k] + vals_desc[hi - 1 - k]
    return smallest, largest


@cached_njit()
def _two_largest_gaps(vals_desc):
    """The cuts c1 ≤ c2 after the two largest gaps between consecutive sorted values (c = index of the first value
    below the gap; c1 = c2 when the row has a single gap)."""
    n = vals_desc.size
    cut_1 = n
    cut_2 = n
    gap_1 = -1.0
    gap_2 = -1.0
    for i in range(n - 1):
        gap = vals_desc[i] - vals_desc[i + 1]
        if gap > gap_1:
            gap_2, cut_2 = gap_1, cut_1
            gap_1, cut_1 = gap, i + 1
        elif gap > gap_2:
            gap_2, cut_2 = gap, i + 1
    return min(cut_1, cut_2), max(cut_1, cut_2)


@cached_njit()
def group_cardinality_bound(vals_desc, t):
    """Lower bound on d* from how many keys of each of three value groups S holds; returns (d_lb, d_endpoint).

    The sorted values are cut at their two largest gaps into groups A > B > C. A set with a, b, c keys of them has
    p(S) in [L_a + L_b + L_c, U_a + U_b + U_c] (L / U: the sums of the smallest / largest of that many keys of the
    group). d_lb is the least distance from t to these intervals over every (a, b, c); when it is positive no
    interval holds t, the nearest endpoint is a real subset and d* = d_lb. Rows whose values form clusters
    (early-training attention with a block of similar keys) have intervals with gaps between them that the
    single-group bound (``cardinality_relaxation``) cannot see. d_endpoint is the best endpoint met. Each distance
    is t minus a sum of three prefix sums: the rounding model of ``_numba_kernels`` (callers use it with
    error-free sums or compare d_lb with E).
    """
    n = vals_desc.size
    cut_1, cut_2 = _two_largest_gaps(vals_desc)
    small_a, large_a = _group_prefixes(vals_desc, 0, cut_1)
    small_b, large_b = _group_prefixes(vals_desc, cut_1, cut_2)
    small_c, large_c = _group_prefixes(vals_desc, cut_2, n)
    d_lb = np.inf
    d_end = np.inf
    for a in range(cut_1 + 1):
        for b in range(cut_2 - cut_1 + 1):
            low_ab = small_a[a] + small_b[b]
            high_ab = large_a[a] + large_b[b]
            for c in range(n - cut_2 + 1):
                low = low_ab + small_c[c]
                high = high_ab + large_c[c]
                if low > t:
                    d_lb = min(d_lb, low - t)
                    d_end = min(d_end, low - t)
                    break  # larger c only moves further up
                if high < t:
                    d_lb = min(d_lb, t - high)
                    d_end = min(d_end, t - high)
                else:
                    d_lb = 0.0
                    d_end = min(d_end, min(t - low, high - t))
    return d_lb, d_end
