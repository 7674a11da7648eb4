"""The four-list search for a perfect split (docs/theta-algorithms.md §3 step 4), as numba functions.

The row's values as exact integers; four lists of subset sums of the smaller values, paired modulo a prime through
a hash table (the modular four-list search of Schroeppel–Shamir, in the form of Wagner's generalized birthday
algorithm), for targets from the larger values split greedily. Sound whatever it finds (an exact integer match is
a real subset) and incomplete: a failure proves nothing.
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._numba_cardinality import _count_spreads
from attnsens.theta._numba_residues import integer_residues, reaches

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
EXPECTED_COUNT_Z = 10.0
"""Counts k whose sums lie more than this many spreads from a target add nothing to its estimate
(``_expected_counts``): each is at most C(40, 20)·e^-50 < 3·10^-11 times the peak density 1/(√(2π)·σ_k), where
the gates compare the estimate with 0.5 and more. The estimate only steers the search (which targets, which
modulus, whether to search), never a bound. With an exp for every count within 40 spreads and a division per
term, the estimate for the 64 targets of a row of 46–48 keys took 25 µs (the call from Python included); with
this cut and one product per term, 10 µs."""
FOUR_LIST_MARK_BITS_LOG2 = 2
"""Bits of the lookup filter per slot of the hash table, as a power of 2: 4 bits a slot, at least 16 per stored pair
sum (the table has at least 4 slots per sum), 8 kB for pair lists of 2,048 sums."""
FOUR_LIST_CANDIDATES = 64
"""Wanted sums whose filter bit is set, gathered before the table is probed for them."""
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
def _insert_pair_sums(left, left_residues, right_grouped, right_offsets, modulus, residue, table, used, stamp, shift,
                      marks):  # fmt: skip
    """Stores every x + y with x in ``left`` (``left_residues`` its residues), y in the right list and
    x + y ≡ ``residue`` (mod ``modulus``) in the open-addressing ``table`` (slots whose ``used`` equals ``stamp``
    are taken), and sets its bit in the bit set ``marks`` (``_mark_shift``); False if the table fills up."""
    mask = table.size - 1
    mark_shift = _mark_shift(marks)
    count = 0
    for a in range(left.size):
        x = left[a]
        r = residue - left_residues[a]  # both in [0, M): no division in the loop
        if r < 0:
            r += modulus
        for i in range(right_offsets[r], right_offsets[r + 1]):
            value = x + right_grouped[i]
            hashed = np.uint64(value) * _HASH_MULTIPLIER
            word, bit = _mark(hashed, mark_shift)
            marks[word] |= bit
            slot = np.int64(hashed >> np.uint64(shift))
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
def _mark_shift(marks):
    """The right shift that takes a Fibonacci hash to a bit index of ``marks`` (64·marks.size bits, a power of 2)."""
    log_bits = 6
    while (1 << log_bits) < 64 * marks.size:
        log_bits += 1
    return np.uint64(64 - log_bits)


@cached_njit()
def _mark(hashed, mark_shift):
    """The word of ``marks`` and the bit within it that stand for a Fibonacci hash (``_mark_shift``)."""
    index = np.int64(hashed >> mark_shift)
    return index >> 6, np.uint64(1) << np.uint64(index & 63)


@cached_njit()
def _in_table(value, table, used, stamp, shift):
    """Whether ``value`` is stored in the open-addressing ``table`` (``_insert_pair_sums``)."""
    mask = table.size - 1
    slot = _hash_slot(value, shift)
    while used[slot] == stamp:
        if table[slot] == value:
            return True
        slot = (slot + 1) & mask
    return False


@cached_njit()
def _meets_pair_sum(left, left_residues, right_grouped, right_offsets, modulus, residue, target, table, used, stamp,
                    shift, marks, candidates):  # fmt: skip
    """Whether target − (x + y) is in the table for some x in ``left`` (``left_residues`` its residues) and y in
    the right list with x + y ≡ ``residue`` (mod ``modulus``).

    The loop over the pairs only tests each wanted sum's bit in ``marks`` (a few kB, in the first-level cache) and
    appends it to ``candidates`` without a branch; the table is probed for the candidates alone, a block at a time.
    A sum in the table has its bit set, so no match is missed; with at least 16 bits per stored sum about one
    wanted sum in 16 or fewer is probed. Probing every wanted sum in the table instead, where most miss, cost
    about twice the time (branches that do not predict and loads from the second-level cache)."""
    mark_shift = _mark_shift(marks)
    last = candidates.size - 1
    found = np.int64(0)
    for a in range(left.size):
        rest = target - left[a]
        r = residue - left_residues[a]
        if r < 0:
            r += modulus
        for i in range(right_offsets[r], right_offsets[r + 1]):
            wanted = rest - right_grouped[i]
            word, bit = _mark(np.uint64(wanted) * _HASH_MULTIPLIER, mark_shift)
            candidates[found] = wanted
            found += np.int64((marks[word] & bit) != 0)
            if found > last:  # the block is full: probe it
                for k in range(found):
                    if _in_table(candidates[k], table, used, stamp, shift):
                        return True
                found = np.int64(0)
    for k in range(found):
        if _in_table(candidates[k], table, used, stamp, shift):
            return True
    return False


@cached_njit()
def four_list_perfect_split(vals_desc, q, long_work=FOUR_LIST_LONG_WORK, gap=-1, crowding=1.0):
    """d = |p(S) − s/2| of a perfect split (2d ≤ q) found by a four-list search, or ∞ when none was found.

    Only for error-free sums (every value an integer multiple of q, s ≤ 2^52·q): the values become exact int64
    multiples v_i of q with total V, and a perfect split is a subset of sum ⌊V/2⌋ (then 2d = (V mod 2)·q). With
    ``gap`` = δ ≥ 0 (δ ≡ V mod 2) the search looks for a subset of sum (V − δ)/2 instead, at d = δ·q/2: the split
    at a proved lower bound (``_numba_residues.residue_bound``), and ``crowding`` scales the estimated count of
    subsets at each target (there: 64 over the residues modulo 64 that subset sums reach, into which they crowd).
    The 40
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
    if gap < 0:
        gap = total % 2
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
        targets[choice] = (total - gap) // 2 - side
    targets = _reachable_targets(searched, targets)
    if targets.size == 0:
        return np.inf
    targets, expected, best_expected = _most_promising_targets(searched, targets)
    expected *= crowding
    best_expected *= crowding
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
    marks = np.empty(1 << max(0, log_size + FOUR_LIST_MARK_BITS_LOG2 - 6), np.uint64)
    candidates = np.empty(FOUR_LIST_CANDIDATES, np.int64)
    for residue in range(tries):
        stamp = residue + 1
        marks[:] = 0
        if not _insert_pair_sums(list_1, residues_1, grouped_2, offsets_2, modulus, residue, table, used, stamp,
                                 shift, marks):  # fmt: skip
            return np.inf  # far more pair sums than expected: the residues are not spread, give up
        for target in targets:
            if _meets_pair_sum(
                list_3, residues_3, grouped_4, offsets_4, modulus, (target - residue) % modulus, target, table, used,
                stamp, shift, marks, candidates,
            ):  # fmt: skip
                return 0.5 * q * float(gap)
    return np.inf


@cached_njit()
def _reachable_targets(searched, targets):
    """The ``targets`` in [0, Σ searched] whose residue modulo 64 some subset sum of ``searched`` has
    (``_numba_residues.integer_residues``): the others hold no subset, whatever the estimate says. A row's larger
    values are multiples of a coarser power of two than its smallest ones, so the low bits of every sum come
    from a few small values, and a target's low bits may be out of their reach once the larger values are fixed
    to a side. Such rows searched up to 2^16 pair sums (about 0.2 ms) for nothing: on the rows of 25–48 keys,
    dropping them and the cheaper estimate (``EXPECTED_COUNT_Z``) took the four-list searches of SmolLM2's from
    147 to 109 ms and the tiny GPT's from 358 to 321 ms (one thread), the same splits found."""
    reach = integer_residues(searched)
    reachable = searched.sum()
    kept = np.empty(targets.size, np.int64)
    count = 0
    for target in targets:
        if 0 <= target <= reachable and reaches(reach, target):
            kept[count] = target
            count += 1
    return kept[:count]


@cached_njit()
def _most_promising_targets(searched, targets):
    """The targets worth a pass of the search: (chosen, Σ of their expected counts, the largest expected count).

    Every residue tried costs one pass to store the left pair sums and one per target to look up the right ones,
    so k targets find about Σ E_i / (1 + k) perfect splits per pass. The targets are taken in decreasing order of
    E (``_expected_counts``; every target is reachable, ``_reachable_targets``) for the k that maximises that rate.
    On the tiny GPT's open rows of 25–48 keys the second of four targets expects a third of the first's splits
    (median), the last two a fifth and a sixth: searching all four spent 5/2 of one target's work for 1.7 times
    its splits."""
    expected = _expected_counts(searched, targets)
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
    # Per count k: 1/σ_k and log(C(m, k) / (√(2π)·σ_k)), so that each (target, count) term is a product, a
    # comparison and, near the target only, one exp.
    inv_sigma = np.zeros(m)
    log_weight = np.zeros(m)
    log_binomial = 0.0  # log C(m, k)
    for k in range(1, m):
        log_binomial += np.log((m - k + 1) / k)
        if sigma[k] > 0.0:
            inv_sigma[k] = 1.0 / sigma[k]
            log_weight[k] = log_binomial - np.log(2.5066282746310002 * sigma[k])
    counts = np.zeros(targets.size)
    for i in range(targets.size):
        target = float(targets[i])
        expected = 0.0
        for k in range(1, m):
            z = (target - k * mean) * inv_sigma[k]  # 0 where σ_k = 0: such a count is skipped below
            if abs(z) < EXPECTED_COUNT_Z and inv_sigma[k] > 0.0:
                expected += np.exp(log_weight[k] - 0.5 * z * z)
        counts[i] = expected
    return counts


@cached_njit()
def _four_list_modulus(expected, pair_count):
    """The largest listed prime ≤ the expected number of perfect splits (one per residue on average) and ≤
    ``pair_count`` (a residue then still holds a pair sum on average), raised to the smallest that keeps a pair list
    (pair_count / M sums) within ``FOUR_LIST_MAX_PAIRS``. Without the second cap a row of 24–27 small powers of two
    (millions of perfect splits, 4,096 pair sums) took M = 8,191, lists of no pair sums, and a division by zero."""
    k = 0
    while (
        k + 1 < FOUR_LIST_MODULI.size and FOUR_LIST_MODULI[k + 1] <= expected and FOUR_LIST_MODULI[k + 1] <= pair_count
    ):
        k += 1
    while k + 1 < FOUR_LIST_MODULI.size and pair_count // FOUR_LIST_MODULI[k] > FOUR_LIST_MAX_PAIRS:
        k += 1
    return FOUR_LIST_MODULI[k]
