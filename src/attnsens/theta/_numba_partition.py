"""Number-partitioning solvers of the θ cascade (docs/theta-algorithms.md §3, §5), as numba functions: the row's
support as values, the cascade's entry to the pruned enumeration, Karmarkar–Karp, the greedy split with best
exchanges and complete Karmarkar–Karp. The cardinality arguments are in ``_numba_cardinality``, the four-list
search in ``_numba_four_list``, the subset-sum lists in ``_numba_enumeration``.

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


MULTISET_MAX_VALUES = 16
MULTISET_SIDE = 1 << 16
MULTISET_SIDE_EXACT = 1 << 20
"""Rows whose non-zeros take at most ``MULTISET_MAX_VALUES`` distinct values are solved exactly by ``multiset_split``
where its two lists hold at most ``MULTISET_SIDE`` sums each in ``certify`` (a few milliseconds at most, about
0.1 ms for four values of 50 copies each), ``MULTISET_SIDE_EXACT`` in ``exact`` (three values of 667 copies each,
2,000 keys: lists of 668 and 446,224 sums, about 40 ms; CKK there ran out of its 2,000,000 nodes)."""


@cached_njit()
def multiset_split(vals_desc, t, side_max=MULTISET_SIDE):
    """(d*, True) for a row with error-free sums whose values take few distinct values u_1 … u_m, with
    multiplicities c_1 … c_m; (∞, False) where it does not apply (more values, or a list longer than
    ``side_max``).

    A subset is fixed by how many copies k_j ∈ [0, c_j] of each value it holds, so d* = min |Σ_j k_j·u_j − t|:
    a meet-in-the-middle over the multiplicities. The values are dealt to two sides (the most copies first, each
    to the side with fewer choices so far); each side lists Σ k_j·u_j over all its choices, sorted, and one sweep
    finds the pair nearest t (``_closest_pair_sum``). With error-free sums every k·u, partial sum and distance is
    a multiple of q/2 no larger than s, hence exact in float64: the minimum is d* itself. Rows of a few repeated
    values (identical keys, a sink beside blocks of equal keys) defeat the heuristics, whose splits stall a few
    values' difference away from t: four values of 50 copies each are 6.8 million subsets of the multiset, two
    lists of 2,601 sums here.
    """
    values = np.empty(MULTISET_MAX_VALUES)
    counts = np.zeros(MULTISET_MAX_VALUES, np.int64)
    m = 0
    for i in range(vals_desc.size):
        if m > 0 and vals_desc[i] == values[m - 1]:
            counts[m - 1] += 1
            continue
        if m == MULTISET_MAX_VALUES:
            return np.inf, False
        values[m] = vals_desc[i]
        counts[m] = 1
        m += 1
    if m == 0:
        return np.inf, False
    side = np.zeros(m, np.int64)
    choices = np.ones(2, np.int64)
    for j in np.argsort(-counts[:m]):
        k = 0 if choices[0] <= choices[1] else 1
        side[j] = k
        choices[k] *= counts[j] + 1
        if choices[k] > side_max:
            return np.inf, False
    left = _multiset_sums(values[:m], counts[:m], side, 0, choices[0])
    right = _multiset_sums(values[:m], counts[:m], side, 1, choices[1])
    return _closest_pair_sum(left, right, t), True


@cached_njit()
def _multiset_sums(values, counts, side, which, size):
    """Σ_j k_j·u_j over every choice of k_j ∈ [0, c_j] for the values on side ``which`` (``size`` choices),
    ascending."""
    sums = np.zeros(size)
    filled = 1
    for j in range(values.size):
        if side[j] != which:
            continue
        for k in range(1, counts[j] + 1):
            added = k * values[j]
            for i in range(filled):
                sums[k * filled + i] = sums[i] + added
        filled *= counts[j] + 1
    return np.sort(sums)
