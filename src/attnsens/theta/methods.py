"""Codes stored in ``ThetaCertificate.method`` and the per-row validation status shared by both kernels.

Kept free of torch and numba imports: the numba kernels read these integers as compile-time constants.
"""

from __future__ import annotations

from enum import IntEnum


class ThetaMethod(IntEnum):
    """The cascade stage at which refinement of a row stopped (docs/theta-algorithms.md §3).

    Stages marked *exact* prove the optimal bisection d* = min_S |p(S) − s/2|; the others stop because the best
    subset found has d ≤ the precision threshold, or because every stage ran without reaching it (the interval is
    then wider). For heuristic stages the lower bound comes from the best subset of this or an earlier stage and
    the upper bound from the largest top-K relaxation bound computed.
    """

    MEET_IN_THE_MIDDLE = 1
    """exact: all 2^n subset sums of the n ≤ 24 (``exact``: 48) non-zeros, Horowitz–Sahni two-list search (rows
    the dominant-atom and top-8 relaxation proofs leave open), of rows of 25–26 that the short-row proofs leave
    open (CPU cascade), and of rows of ≤ 32 that every heuristic leaves open."""
    DOMINANT_ATOM = 2
    """exact: p_max ≥ s/2, so d* = p_max − s/2 (docs/math.md T2(a))."""
    K_ATOM_RELAXATION = 3
    """exact: the top-8 relaxation bound d_lb = min_T dist(s/2, [p(T), p(T) + r_8]) is positive, hence d* = d_lb."""
    PERFECT_PARTITION = 4
    """exact: sums are error-free multiples of the row quantum q and a subset with 2d ≤ q was found."""
    FIRST_FIT_ONE_TARGET = 5
    """first-fit of the tail (original order) into the best top-8 target reached the threshold."""
    FIRST_FIT_SIXTEEN_TARGETS = 6
    """first-fit into the 16 best top-8 targets reached the threshold."""
    KARMARKAR_KARP = 7
    """largest-differencing (Karmarkar–Karp) reached the threshold."""
    K_ATOM_RELAXATION_14 = 8
    """exact: the top-14 relaxation bound is positive, hence d* = d_lb."""
    CKK_PROVED = 9
    """exact: complete Karmarkar–Karp exhausted its search tree (or met the perfect-partition rule)."""
    CKK_BUDGET = 10
    """complete Karmarkar–Karp reached the threshold or ran out of nodes; interval may be wide."""
    SORTED_GREEDY = 11
    """torch path: greedy balancing in descending order reached the threshold or was the last stage run."""
    PREFIX_BEST_FIT = 12
    """GPU kernel: tail prefix (original order), 8 best-fit rounds and the best single overshoot into the best top-8
    target (or, for rows that stay open, the 16 best) reached the threshold (docs/theta-algorithms.md §3 "pbf", §7)."""

    TOP14_ENDPOINT = 13
    """the best endpoint subset (T or T ∪ tail) of the top-14 relaxation reached the threshold (not exact)."""
    SWAP_DESCENT = 14
    """a greedy split improved by best single exchanges (one value in, one out) reached the threshold; it is what
    settles near-uniform rows (e.g. attention at initialisation), where first-fit and Karmarkar–Karp end about half
    a key from s/2."""
    CARDINALITY_BOUND = 15
    """exact: for every subset T of the top-8 atoms and every count k of the other keys, the subsets T ∪ U with
    |U| = k have sums between p(T) plus the k smallest and p(T) plus the k largest other values; no such interval
    contains s/2, so the nearest endpoint is optimal. Settles near-uniform rows with an odd number of keys."""
    CARDINALITY_SEARCH = 16
    """exact: depth-first search over the values, every branch cut by the cardinality bound of the values not yet
    placed, exhausted its tree or met the perfect-partition rule within its node budget."""
    CARDINALITY_SEARCH_BUDGET = 17
    """that search ran out of nodes, but the best split it found reached the threshold (not exact)."""
    FIRST_FIT_BINADES = 18
    """first-fit decreasing by binade (the largest values first, key order within a binade) into s/2 reached the
    threshold: long rows that the key-order fill leaves open."""
    COUNT_PRUNED_MITM = 19
    """exact: meet-in-the-middle over the subset counts whose sums can come near s/2, each half's sums cut to those
    that can still pair near it, found no subset closer than the best known (near-uniform rows with an odd count
    and no perfect split, where the cardinality bound cannot settle them)."""
    MULTISET_SPLIT = 20
    """exact: the row's values take at most 16 distinct values, and a meet-in-the-middle over how many copies of
    each a subset holds found the nearest split: rows of a few repeated values, left open by every heuristic."""
    RESIDUE_BOUND = 21
    """exact: sums are error-free, the residues modulo 64 that the row's subset sums reach (in units of q) leave
    none nearer s/2 than d_lb > q/2, and a subset at d_lb was found (rows of 25–48 keys whose lowest bits come
    from a few small values)."""

    @property
    def is_exact(self) -> bool:
        """Whether this stage proves the optimal bisection."""
        return self in _EXACT_METHODS


_EXACT_METHODS = frozenset(
    {
        ThetaMethod.MEET_IN_THE_MIDDLE,
        ThetaMethod.DOMINANT_ATOM,
        ThetaMethod.K_ATOM_RELAXATION,
        ThetaMethod.PERFECT_PARTITION,
        ThetaMethod.K_ATOM_RELAXATION_14,
        ThetaMethod.CKK_PROVED,
        ThetaMethod.CARDINALITY_BOUND,
        ThetaMethod.CARDINALITY_SEARCH,
        ThetaMethod.COUNT_PRUNED_MITM,
        ThetaMethod.MULTISET_SPLIT,
        ThetaMethod.RESIDUE_BOUND,
    }
)


class RowStatus(IntEnum):
    """Validation outcome of one row, produced by the kernels and turned into an InputError by the caller."""

    OK = 0
    NON_FINITE = 1
    NEGATIVE = 2
    EMPTY = 3
    BAD_SUM = 4
