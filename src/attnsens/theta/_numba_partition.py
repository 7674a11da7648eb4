"""Number-partitioning solvers used by the θ cascade (docs/theta-algorithms.md §3, §5), as numba functions.

Each returns a bisection distance d = |p(S) − t| (or twice it, a set difference) computed from the row's stored
values; the rounding model is the one of ``_numba_kernels``: every returned distance is within E of the real
distance of the subset it describes.
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._numba_enumeration import _closest_pair_sum, mitm_workspace, pruned_meet_in_the_middle

CKK_EXHAUSTED = 0
CKK_PERFECT = 1
CKK_THRESHOLD = 2
CKK_OUT_OF_NODES = 3
LIST_START = 1 << 12
"""First buffer size of each half's list in ``count_pruned_meet_in_the_middle`` (doubled as needed)."""


@cached_njit()
def support_values(row, n):
    """The n positive entries of ``row`` in key order (float64); stops at the n-th."""
    vals = np.empty(n)
    k = 0
    for i in range(row.size):
        if k == n:
            break
        x = np.float64(row[i])
        if x > 0.0:
            vals[k] = x
            k += 1
    return vals


@cached_njit()
def descending_support(row, n):
    """The n positive entries of ``row`` as float64, largest first (the order KK, CKK and exchanges read)."""
    return np.sort(support_values(row, n))[::-1].copy()


@cached_njit()
def meet_in_the_middle(row, n, t, e, d_known, workspace):
    """d* = min_S |p(S) − t| over the n non-zeros of ``row`` (error radius ``e``): the pruned meet-in-the-middle
    (``_numba_enumeration.pruned_meet_in_the_middle``) from the nearer of ``d_known`` (the distance of a real
    subset, or ∞) and the Karmarkar–Karp split's.

    The lists are built in ``workspace`` (``mitm_workspace``) when it is large enough, else in new buffers. Fresh
    buffers of 2^18 values and more come from the operating system as untouched pages, and writing them cost as
    much time again as the enumeration itself (one row of 40 keys: 18 ms, of which 10 ms in the kernel's page
    faults); rows enumerated one after another in the same workspace pay that once.
    """
    vals = descending_support(row, n)
    if workspace.shape[1] < 1 << (n - n // 2):
        workspace = mitm_workspace(n)
    return pruned_meet_in_the_middle(vals, t, min(d_known, karmarkar_karp(vals)), 2.0 * e, workspace)


@cached_njit()
def karmarkar_karp(vals_desc):
    """Largest differencing: repeatedly replace the two largest by their difference; d = final / 2.

    The values stay sorted in a sliding window of a 2n buffer: the two largest leave from the front, and their
    difference — usually small — is inserted from the back, so each step moves only the few values below it.
    Every step subtracts the same two numbers a heap would, so the result is the same.
    """
    n = vals_desc.size
    buf = np.empty(2 * n)
    buf[:n] = vals_desc
    start = 0
    end = n
    while end - start > 1:
        d = buf[start] - buf[start + 1]
        start += 2
        k = end
        while k > start and buf[k - 1] < d:
            buf[k] = buf[k - 1]
            k -= 1
        buf[k] = d
        end += 1
    return 0.5 * buf[start]


@cached_njit()
def swap_descent(vals_desc, t, stop_d, rounds):
    """Greedy split refined by best single exchanges; returns d = |p(S) − t| of the final subset S.

    The values (descending) go one by one to the lighter side, S or its complement. Then, while d > ``stop_d``
    and for at most ``rounds`` rounds, the pair (a ∈ S, b ∉ S) whose difference b − a is closest to the gap
    g = t − p(S) is exchanged if that shrinks the gap. With k values on each side there are about k² such
    differences, so on near-uniform rows — where first-fit and Karmarkar–Karp stop about half a key from t —
    one exchange cuts the gap by a factor of order k². p(S) is summed afresh every round: the returned distance
    is one plain float64 sum of S's values minus t (rounding model of ``_numba_kernels``).
    """
    n = vals_desc.size
    in_s = np.zeros(n, np.bool_)
    mass_s = 0.0
    mass_rest = 0.0
    for i in range(n):
        if mass_s <= mass_rest:
            in_s[i] = True
            mass_s += vals_desc[i]
        else:
            mass_rest += vals_desc[i]
    members = np.empty(n, np.int64)
    others = np.empty(n, np.int64)
    d = np.inf
    for round_ in range(rounds + 1):
        p_s = 0.0
        for i in range(n):
            if in_s[i]:
                p_s += vals_desc[i]
        gap = t - p_s
        d = abs(gap)
        if d <= stop_d or round_ == rounds:
            break
        n_members = 0
        n_others = 0
        for i in range(n - 1, -1, -1):  # both lists in ascending value order
            if in_s[i]:
                members[n_members] = i
                n_members += 1
            else:
                others[n_others] = i
                n_others += 1
        best = d
        best_a = -1
        best_b = -1
        j = 0
        for k in range(n_members):
            a = members[k]
            wanted = vals_desc[a] + gap  # the b that closes the gap exactly; rises with a
            while j + 1 < n_others and vals_desc[others[j + 1]] <= wanted:
                j += 1
            for jj in range(j, min(j + 2, n_others)):
                b = others[jj]
                miss = abs(gap - (vals_desc[b] - vals_desc[a]))
                if miss < best:
                    best = miss
                    best_a = a
                    best_b = b
        if best_a < 0:
            break
        in_s[best_a] = False
        in_s[best_b] = True
    return d


@cached_njit()
def complete_karmarkar_karp(vals_desc, stop_diff, quantum_diff, budget):
    """Complete Karmarkar–Karp (Korf 1998) on descending values; returns (best difference, outcome code).

    Depth-first: at each node the two largest numbers go to different sets (difference, first) or the same set
    (sum). A node whose largest number ≥ the sum of the rest is a leaf. The search stops when the best
    difference is ≤ ``stop_diff`` (not a proof), ≤ ``quantum_diff`` (perfect-partition proof), after
    ``budget`` nodes (not a proof), or when the tree is exhausted (proof). Lists live in a triangular workspace.
    """
    n = vals_desc.size
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    for k in range(n):
        offsets[k + 1] = offsets[k] + (n - k)
    work = np.empty(offsets[n])
    work[:n] = vals_desc
    choice = np.zeros(n, np.int8)
    best = np.inf
    nodes = 0
    k = 0
    while k >= 0:
        m = n - k
        base = offsets[k]
        if choice[k] == 0:
            if nodes >= budget:
                return best, CKK_OUT_OF_NODES
            nodes += 1
            x0 = work[base]
            rest = 0.0
            for i in range(1, m):
                rest += work[base + i]
            if x0 >= rest:
                best = min(best, x0 - rest)
                if best <= quantum_diff:
                    return best, CKK_PERFECT
                if best <= stop_diff:
                    return best, CKK_THRESHOLD
                k -= 1
                continue
            choice[k] = 1
            v = x0 - work[base + 1]
            dst = offsets[k + 1]
            placed = False
            for i in range(2, m):
                y = work[base + i]
                if not placed and v >= y:
                    work[dst] = v
                    dst += 1
                    placed = True
                work[dst] = y
                dst += 1
            if not placed:
                work[dst] = v
            k += 1
            choice[k] = 0
        elif choice[k] == 1:
            choice[k] = 2
            dst = offsets[k + 1]
            work[dst] = work[base] + work[base + 1]
            for i in range(2, m):
                work[dst + i - 1] = work[base + i]
            k += 1
            choice[k] = 0
        else:
            k -= 1
    return best, CKK_EXHAUSTED


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
def _suffix_distance(prefix, n, i, g):
    """(bound, endpoint): the least distance from g to [L_k, U_k] over the counts k of values[i:] (sorted
    descending, ``prefix`` their prefix sums; L_k / U_k the sums of the k smallest / largest), and the distance
    from g to the nearest endpoint met (the sum of a real subset of values[i:])."""
    if g <= 0.0:
        return -g, -g
    m = n - i
    lo = 0
    hi = m
    while lo < hi:  # the largest k with L_k ≤ g
        mid = (lo + hi + 1) // 2
        if prefix[n] - prefix[n - mid] <= g:
            lo = mid
        else:
            hi = mid - 1
    below = g - (prefix[i + lo] - prefix[i])
    above = (prefix[n] - prefix[n - lo - 1]) - g if lo < m else np.inf
    return (min(below, above) if below > 0.0 else 0.0), min(abs(below), above)


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
    mass = np.zeros(n + 1)
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
            bound, endpoint = _suffix_distance(prefix, n, depth, g)
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


FOUR_LIST_MODULI = np.array([2, 3, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191], np.int64)
"""Primes just below powers of two: an odd modulus spreads the residues even when every value is an even
multiple of the quantum (values of a row mostly share one binade, so their low bits are not random)."""
FOUR_LIST_GROUP = 10
"""Values per list of the four-list search (2^10 subset sums each); larger values beyond 40 are split greedily."""
FOUR_LIST_FLIPS = 6
"""Smallest of the larger values put on either side: up to 2^6 targets for the same lists, of which the search
takes the most promising (``_most_promising_targets``); the rest are split greedily. One target may fall between
the bumps into which sums of clustered values crowd, or, on rows with a few large keys, where the large keys'
greedy split leaves no reachable sum. Of the rows of 25–48 keys that the cascade with two such values (four
targets) left open, at the same budget of pair sums, the search with 4, 6 and 8 found a perfect split in 8.0 %,
10.2 % and 10.3 % of the tiny GPT's (1,799 rows) and 2.3 %, 3.1 % and 3.2 % of SmolLM2's (1,818 rows)."""
FOUR_LIST_MIN_EXPECTED = 0.5
"""Rows expected to have fewer perfect splits than this skip the search. On the tiny GPT's open rows of 25–48
keys it found one in 3 % of the rows expected to have 0.01–0.1, in 17 % at 0.1–0.25 and in 21 % at 0.25–1, at
about 60 µs a row."""
FOUR_LIST_MAX_PAIRS = 1 << 12
"""Largest expected size of one list of pair sums: the modulus is raised until the lists are this short."""
FOUR_LIST_MIN_SUCCESS = 0.1
"""Rows whose search is unlikely to succeed within its budget skip it: with E expected perfect splits (summed over
the targets searched) spread over the M residues and ``tries`` residues searched, it finds one with probability
about 1 − exp(−E·tries/M). Rows of 25–48 keys of SmolLM2 at 512 tokens and of the tiny GPT, search success by
that estimate: below 0.05, 3 % and 1 %; 0.05–0.1, 11 % and 6 %; 0.1–0.2, 11 % and 13 %; 0.2–0.4, 31 % and 27 %;
0.4–0.7, 47 % and 49 %; ≥ 0.7, 87 % and 96 %. With the targets chosen by ``_most_promising_targets`` a row
searches more residues, so more rows clear a gate of 0.05; at 0.1 every tensor measured was both faster and more
often exact than with all targets and a gate of 0.05 (rows of 25–48 keys, alternating runs: the tiny GPT 79.2 →
80.2 % exact, 181–193 → 162–164 ms; SmolLM2 71.0 → 71.3 %, the same time; causal synthetic rows 64.9 → 65.5 %)."""
FOUR_LIST_WORK = 1 << 14
"""Pair sums formed per row, over all residues and targets tried, before the search gives up (~50 µs at most).
With the count-by-count estimate the tiny GPT's open short rows expected to hold ≥ 1,000 perfect splits gave
one up in 97 % of the rows; rows expected to hold 1–64 (where it succeeded in 50–73 %) spend the budget."""
FOUR_LIST_SURE = 0.7
"""Estimated chance of success above which a search is worth the long budget (``FOUR_LIST_LONG_WORK``). Rows above
it at the short budget found a split in 87–96 %, rows lifted above it by the long budget in 69 %."""
FOUR_LIST_LONG_WORK = 1 << 16
"""Pair sums a row may use when ``FOUR_LIST_WORK`` leaves its estimated chance below ``FOUR_LIST_SURE`` and this
budget lifts it above. Of the rows of 25–48 keys that the cascade with four targets and the short budget left
open, 337 of the tiny GPT's 1,799 and 153 of SmolLM2's 1,818 qualified, and the search found a perfect split in
69 % of both (all open rows: 21 % and 8 % with the 64 targets and both budgets, 10 % and 3 % with the short one
alone). Twice this budget found one in 71 % of 425 and 73 % of 291 rows, but cost SmolLM2's whole tensor about
a third more time instead of a fifth."""


@cached_njit()
def _subset_sums_residues(values, modulus):
    """All 2^m subset sums of the int64 ``values`` (unsorted; index bits say which values are in) and their
    residues modulo ``modulus``, both by doubling: a residue is the residue of a shorter sum plus one value's,
    reduced by one comparison, so no division runs per sum."""
    size = 1 << values.size
    sums = np.empty(size, np.int64)
    residues = np.empty(size, np.int64)
    sums[0] = 0
    residues[0] = 0
    for k in range(values.size):
        step = 1 << k
        value = values[k]
        value_residue = value % modulus
        for j in range(step):
            sums[step + j] = sums[j] + value
            r = residues[j] + value_residue
            residues[step + j] = r - modulus if r >= modulus else r
    return sums, residues


@cached_njit()
def _by_residue(sums, residues, modulus):
    """``sums`` grouped by their ``residues`` (counting sort): (grouped, offsets), residue r's sums are
    grouped[offsets[r]:offsets[r + 1]]."""
    offsets = np.zeros(modulus + 1, np.int64)
    for r in residues:
        offsets[r + 1] += 1
    for r in range(modulus):
        offsets[r + 1] += offsets[r]
    fill = offsets[:modulus].copy()
    grouped = np.empty(sums.size, np.int64)
    for i in range(sums.size):
        r = residues[i]
        grouped[fill[r]] = sums[i]
        fill[r] += 1
    return grouped, offsets


_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
"""Fibonacci hashing: the top bits of x·⌊2^64/φ⌋ spread consecutive integers over the table."""


@cached_njit()
def _hash_slot(x, shift):
    return np.int64((np.uint64(x) * _HASH_MULTIPLIER) >> np.uint64(shift))


@cached_njit()
def _insert_pair_sums(left, left_residues, right_grouped, right_offsets, modulus, residue, table, used, stamp, shift):
    """Stores every x + y with x in ``left`` (``left_residues`` its residues), y in the right list and
    x + y ≡ ``residue`` (mod ``modulus``) in the open-addressing ``table`` (slots whose ``used`` equals ``stamp``
    are taken); False if the table fills up."""
    mask = table.size - 1
    count = 0
    for a in range(left.size):
        x = left[a]
        r = residue - left_residues[a]  # both in [0, M): no division in the loop
        if r < 0:
            r += modulus
        for i in range(right_offsets[r], right_offsets[r + 1]):
            value = x + right_grouped[i]
            slot = _hash_slot(value, shift)
            while used[slot] == stamp and table[slot] != value:
                slot = (slot + 1) & mask
            if used[slot] != stamp:
                count += 1
                if 2 * count > table.size:
                    return False
                used[slot] = stamp
                table[slot] = value
    return True


@cached_njit()
def _meets_pair_sum(left, left_residues, right_grouped, right_offsets, modulus, residue, target, table, used, stamp,
                    shift):  # fmt: skip
    """Whether target − (x + y) is in the table for some x in ``left`` (``left_residues`` its residues) and y in
    the right list with x + y ≡ ``residue`` (mod ``modulus``)."""
    mask = table.size - 1
    for a in range(left.size):
        x = left[a]
        r = residue - left_residues[a]
        if r < 0:
            r += modulus
        for i in range(right_offsets[r], right_offsets[r + 1]):
            wanted = target - (x + right_grouped[i])
            slot = _hash_slot(wanted, shift)
            while used[slot] == stamp:
                if table[slot] == wanted:
                    return True
                slot = (slot + 1) & mask
    return False


@cached_njit()
def four_list_perfect_split(vals_desc, q, long_work=FOUR_LIST_LONG_WORK):
    """d = |p(S) − s/2| of a perfect split (2d ≤ q) found by a four-list search, or ∞ when none was found.

    Only for error-free sums (every value an integer multiple of q, s ≤ 2^52·q): the values become exact int64
    multiples v_i of q with total V, and a perfect split is a subset of sum ⌊V/2⌋ (then 2d = (V mod 2)·q). The 40
    smallest values go to four lists of 2^10 subset sums; the larger ones are split greedily and fix the target
    T (the ``FOUR_LIST_FLIPS`` smallest of them on either side: up to 64 targets, of which it searches those that
    promise the most splits per pass, ``_most_promising_targets``). With M a modulus and r a residue, the pair
    sums x1 + x2 ≡ r and x3 + x4 ≡ T − r (mod M) are matched exactly through a hash table (the modular four-list
    idea of Schroeppel & Shamir 1981, in the form of Wagner's generalized birthday search, 2002).
    The number of searched subsets with sum exactly T is estimated count by count (``_expected_counts``), and M
    is chosen near it: one residue then holds about one of them, at a cost of a few pair lists of ~2^20 / M sums
    instead of the 2^(n/2) of meet-in-the-middle. It settles rows of 33–48 keys where a perfect
    split exists, which on early-training attention is nearly all of them. The search is sound whatever it
    finds (an exact integer match is a real subset); it is incomplete, so failure proves nothing.

    ``long_work``: the most pair sums a row nearly sure to succeed may use (``FOUR_LIST_LONG_WORK``); callers that
    enumerate the row anyway when the search fails pass ``FOUR_LIST_WORK`` where the enumeration is cheaper.
    """
    n = vals_desc.size
    group = min(n // 4, FOUR_LIST_GROUP)
    n_fixed = n - 4 * group
    ints = np.empty(n, np.int64)
    for i in range(n):
        ints[i] = np.int64(vals_desc[i] / q)
    total = ints.sum()
    side_in = np.int64(0)
    side_out = np.int64(0)
    n_flip = min(n_fixed, FOUR_LIST_FLIPS)
    for i in range(n_fixed - n_flip):
        if side_in <= side_out:
            side_in += ints[i]
        else:
            side_out += ints[i]
    searched = ints[n_fixed:]
    targets = np.empty(1 << n_flip, np.int64)
    for choice in range(1 << n_flip):  # the smallest fixed values on either side: one target each
        side = side_in
        for k in range(n_flip):
            if (choice >> k) & 1:
                side += ints[n_fixed - n_flip + k]
        targets[choice] = total // 2 - side
    targets, expected, best_expected = _most_promising_targets(searched, targets)
    if best_expected < FOUR_LIST_MIN_EXPECTED:
        return np.inf
    modulus = _four_list_modulus(best_expected, 1 << (2 * group))
    pairs = (1 << (2 * group)) // modulus
    passes = 1 + targets.size
    tries = min(modulus, max(1, FOUR_LIST_WORK // (passes * pairs)))
    chance = 1.0 - np.exp(-expected * tries / modulus)
    if chance < FOUR_LIST_SURE:
        long_tries = min(modulus, max(1, long_work // (passes * pairs)))
        long_chance = 1.0 - np.exp(-expected * long_tries / modulus)
        if long_chance >= FOUR_LIST_SURE:  # nearly sure to succeed with more residues: worth them
            tries, chance = long_tries, long_chance
    if chance < FOUR_LIST_MIN_SUCCESS:
        return np.inf  # a few per cent at best: the rest of the cascade settles the row
    list_1, residues_1 = _subset_sums_residues(searched[0::4].copy(), modulus)
    list_2, residues_2 = _subset_sums_residues(searched[1::4].copy(), modulus)
    list_3, residues_3 = _subset_sums_residues(searched[2::4].copy(), modulus)
    list_4, residues_4 = _subset_sums_residues(searched[3::4].copy(), modulus)
    grouped_2, offsets_2 = _by_residue(list_2, residues_2, modulus)
    grouped_4, offsets_4 = _by_residue(list_4, residues_4, modulus)
    log_size = 1
    while (1 << log_size) < 4 * pairs:
        log_size += 1
    shift = 64 - log_size
    table = np.empty(1 << log_size, np.int64)
    used = np.zeros(1 << log_size, np.int64)
    for residue in range(tries):
        stamp = residue + 1
        if not _insert_pair_sums(list_1, residues_1, grouped_2, offsets_2, modulus, residue, table, used, stamp,
                                 shift):  # fmt: skip
            return np.inf  # far more pair sums than expected: the residues are not spread, give up
        for target in targets:
            if _meets_pair_sum(
                list_3, residues_3, grouped_4, offsets_4, modulus, (target - residue) % modulus, target, table, used,
                stamp, shift,
            ):  # fmt: skip
                return 0.5 * q * float(total % 2)
    return np.inf


@cached_njit()
def _most_promising_targets(searched, targets):
    """The targets worth a pass of the search: (chosen, Σ of their expected counts, the largest expected count).

    Every residue tried costs one pass to store the left pair sums and one per target to look up the right ones,
    so k targets find about Σ E_i / (1 + k) perfect splits per pass. The targets are taken in decreasing order of
    E (``_expected_counts``; those outside [0, Σ searched] have none) for the k that maximises that rate.
    On the tiny GPT's open rows of 25–48 keys the second of four targets expects a third of the first's splits
    (median), the last two a fifth and a sixth: searching all four spent 5/2 of one target's work for 1.7 times
    its splits."""
    expected = _expected_counts(searched, targets)
    reachable = searched.sum()
    for k in range(targets.size):
        if not 0 <= targets[k] <= reachable:
            expected[k] = 0.0
    order = np.argsort(-expected)
    best_rate = 0.0
    chosen = 1
    total = 0.0
    chosen_total = expected[order[0]]
    for k in range(targets.size):
        total += expected[order[k]]
        if total / (2 + k) > best_rate:
            best_rate = total / (2 + k)
            chosen = k + 1
            chosen_total = total
    return targets[order[:chosen]].copy(), chosen_total, expected[order[0]]


@cached_njit()
def _expected_counts(values, targets):
    """For each of ``targets``, the expected number of subsets of the int64 ``values`` whose sum is exactly that
    target: Σ_k C(m, k)·φ(z_k)/σ_k, the sums of k values drawn without replacement taken as Gaussian (mean k·μ,
    σ_k² = k(m − k)/m · var). The spreads and binomials are shared by the targets.

    Count by count, not one Gaussian over all subsets: on near-uniform rows the sums crowd into one bump per count,
    and a target between two bumps (an odd count's s/2) has far fewer subsets than one Gaussian of the spread of
    all subset sums would give. On the tiny GPT's open short rows that one Gaussian expected ≥ 1,000, the search
    failed in 17 %; of those this estimate expects ≥ 1,000 in, it failed in 3 %."""
    m = values.size
    mean, sigma = _count_spreads(values)
    log_binomial = np.zeros(m)  # log C(m, k), k = 1 … m − 1 (index k)
    for k in range(1, m):
        log_binomial[k] = log_binomial[k - 1] + np.log((m - k + 1) / k)
    counts = np.zeros(targets.size)
    for i in range(targets.size):
        expected = 0.0
        for k in range(1, m):
            if sigma[k] > 0.0:
                z = (float(targets[i]) - k * mean) / sigma[k]
                if abs(z) < 40.0:
                    expected += np.exp(log_binomial[k] - 0.5 * z * z) / (2.5066282746310002 * sigma[k])
        counts[i] = expected
    return counts


@cached_njit()
def _four_list_modulus(expected, pair_count):
    """The largest listed prime ≤ the expected number of perfect splits (one per residue on average), raised to
    the smallest that keeps a pair list (pair_count / M sums) within ``FOUR_LIST_MAX_PAIRS``."""
    k = 0
    while k + 1 < FOUR_LIST_MODULI.size and FOUR_LIST_MODULI[k + 1] <= expected:
        k += 1
    while k + 1 < FOUR_LIST_MODULI.size and pair_count // FOUR_LIST_MODULI[k] > FOUR_LIST_MAX_PAIRS:
        k += 1
    return FOUR_LIST_MODULI[k]
