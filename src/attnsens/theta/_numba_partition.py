"""Number-partitioning solvers used by the θ cascade (THETA_ALGORITHMS.md §3, §5), as numba functions.

Each returns a bisection distance d = |p(S) − t| (or twice it, a set difference) computed from the row's stored
values; the rounding model is the one of ``_numba_kernels``: every returned distance is within E of the real
distance of the subset it describes.
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit

CKK_EXHAUSTED = 0
CKK_PERFECT = 1
CKK_THRESHOLD = 2
CKK_OUT_OF_NODES = 3


@cached_njit()
def _sorted_subset_sums(vals):
    """All 2^m subset sums of ``vals`` in ascending order, by merge-doubling (no sort, O(2^m))."""
    size_all = 1 << vals.size
    out = np.empty(size_all)
    tmp = np.empty(size_all)
    out[0] = 0.0
    size = 1
    for v in vals:
        i = 0
        j = 0
        k = 0
        while i < size and j < size:  # branch-free: which list advances is data, not control flow
            a = out[i]
            b = out[j] + v
            take_a = a <= b
            tmp[k] = a if take_a else b
            i += take_a
            j += not take_a
            k += 1
        while i < size:
            tmp[k] = out[i]
            i += 1
            k += 1
        while j < size:
            tmp[k] = out[j] + v
            j += 1
            k += 1
        out, tmp = tmp, out
        size *= 2
    return out


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
def meet_in_the_middle(row, n, t):
    """d* = min_S |p(S) − t| over the n non-zeros: two sorted half-lists, one two-pointer sweep."""
    vals = support_values(row, n)
    half = n // 2
    a = _sorted_subset_sums(vals[:half])
    b = _sorted_subset_sums(vals[half:])
    i = 0
    j = b.size - 1
    best = np.inf
    while i < a.size and j >= 0:
        v = (a[i] + b[j]) - t
        if v == 0.0:
            return 0.0
        below = v < 0.0
        best = min(best, abs(v))
        i += below
        j -= not below
    return best


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
def window_meet_in_the_middle(vals_desc, t, width, choice_bits):
    """d = |p(S) − t| of the best S = A ∪ V found: V the best subset of the ``width`` smallest values
    (meet-in-the-middle towards t − p(A)), A a subset of the larger values chosen to centre that target.

    A search for a perfect split (2d ≤ q) on rows too long for the full enumeration: 2^width subsets of the small
    values reach every multiple of q near the middle of their sums when 2^width·q is large against the spread
    of those sums, at the cost of 2^(width/2). On near-uniform rows the sums of j small values crowd around
    [L_j, U_j] (the j smallest / largest of them) with gaps between consecutive j, so A must put the target in
    the middle of one such interval: A is one side of a greedy split of the larger values except the
    ``choice_bits`` smallest of them, plus the subset of those that centres t − p(A) best on an interval of
    j = width/2 ± 3 values.
    """
    n = vals_desc.size
    big = n - width
    n_choice = min(big, choice_bits)
    n_greedy = big - n_choice
    side_a = 0.0
    side_b = 0.0
    for i in range(n_greedy):
        if side_a <= side_b:
            side_a += vals_desc[i]
        else:
            side_b += vals_desc[i]
    small = vals_desc[big:]
    largest = np.zeros(width + 1)
    smallest = np.zeros(width + 1)
    for k in range(width):
        largest[k + 1] = largest[k] + small[k]
        smallest[k + 1] = smallest[k] + small[width - 1 - k]
    choice = vals_desc[n_greedy:big]
    sums = np.empty(1 << n_choice)
    sums[0] = 0.0
    for k in range(n_choice):
        step = 1 << k
        for j in range(step):
            sums[step + j] = sums[j] + choice[k]
    best_score = np.inf
    best_target = t - side_a
    for base in (side_a, side_b):
        for a in sums:
            g = t - base - a
            for j in range(max(0, width // 2 - 3), min(width, width // 2 + 3) + 1):
                score = abs(g - 0.5 * (smallest[j] + largest[j]))
                if score < best_score:
                    best_score = score
                    best_target = g
    return meet_in_the_middle(small, width, best_target)


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
    prefix = np.empty(n + 1)
    prefix[0] = 0.0
    for i in range(n):
        prefix[i + 1] = prefix[i] + vals_desc[i]
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
