"""The one pass over a row that opens the θ cascade: sum, support, validity, quantum and the top-K atoms.

Part of the numba kernels (``_numba_kernels`` holds the rounding model and the driver). Integer views of the
rows make the support statistics vectorisable reductions; the top-K search reads only the entries that can
belong to it.
"""

from __future__ import annotations

import math

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._constants import EXACT_SUM_QUANTA_LOG2, SMALLEST_EXACT_SUM
from attnsens.theta.methods import RowStatus

_OK = int(RowStatus.OK)
_NON_FINITE = int(RowStatus.NON_FINITE)
_NEGATIVE = int(RowStatus.NEGATIVE)
_EMPTY = int(RowStatus.EMPTY)


@cached_njit()
def _lowest_bit(x):
    """The weight 2^k of the lowest set mantissa bit of a positive float64 x (x is a multiple of it)."""
    m, e = math.frexp(x)
    mantissa = np.int64(m * 9007199254740992.0)
    return math.ldexp(np.float64(mantissa & -mantissa), e - 53)


@cached_njit()
def _proving_exponent(total):
    """The smallest k with total ≤ 2^52·2^k (total > 0): 2^k is the coarsest quantum that proves sums up to total."""
    m, e = math.frexp(total)
    if m == 0.5:  # total is itself a power of two
        e -= 1
    return e - EXACT_SUM_QUANTA_LOG2


@cached_njit()
def _all_float32_multiples(bits, end, k):
    """Whether every positive float32 of row[:end], given by its int32 ``bits``, is an integer multiple of 2^k.

    The value of bits b > 0 is m·2^(max(f, 1) − 150), f = b >> 23 its biased exponent and m its 24-bit
    significand (with the implicit leading bit where f ≥ 1), so it is a multiple of 2^k exactly when the low
    k + 150 − max(f, 1) bits of m are zero (at most 24 of them: all 24 means 2^k exceeds the value). A subnormal's
    significand may take the leading bit too: below 24 bits the mask leaves it out, and at 24 the others are
    not all zero. Integer operations that vectorise, in blocks of 64 keys, stopping after the first block with
    an entry that is not (on attention rows, the first tiny entry with a full mantissa): the same answer as
    dividing each value by 2^k and comparing with its floor, without the division.
    """
    zero = np.int32(0)
    offset = np.int32(k + 150)
    i = 0
    while i < end:
        block = bits[i : min(end, i + 64)]
        bad = zero
        for j in range(block.size):
            b = block[j]
            significand = (b & np.int32(0x7FFFFF)) | np.int32(0x800000)
            low = min(max(offset - max(b >> np.int32(23), np.int32(1)), zero), np.int32(24))
            remainder = significand & ((np.int32(1) << low) - np.int32(1))
            bad |= remainder if b > zero else zero
        if bad != zero:
            return False
        i += 64
    return True


@cached_njit()
def row_lowest_bit(row, end):
    """The lowest set mantissa bit over the positive entries of row[:end]: every entry is a multiple of it."""
    q = np.inf
    for i in range(end):
        x = np.float64(row[i])
        if x > 0.0:
            q = min(q, _lowest_bit(x))
    return q


@cached_njit()
def _insert_top(top_v, top_i, x, i):
    """Insert x (index i) into the descending top-K buffer without branches: each slot keeps its entry, takes its
    upper neighbour's, or takes x; ties keep the earlier index first."""
    for j in range(top_v.size - 1, 0, -1):
        keep = top_v[j] >= x
        shift = top_v[j - 1] < x
        top_v[j] = top_v[j] if keep else (top_v[j - 1] if shift else x)
        top_i[j] = top_i[j] if keep else (top_i[j - 1] if shift else i)
    take = top_v[0] < x
    top_v[0] = x if take else top_v[0]
    top_i[0] = i if take else top_i[0]


@cached_njit(fastmath={"reassoc"})
def float64_sum(row):
    """Σ row in float64, in whatever order vectorises: the error radius E holds for every summation order (the row
    scan's sum, and the whole-row first-fit's block sums)."""
    total = 0.0
    for i in range(row.size):
        total += np.float64(row[i])
    return total


@cached_njit()
def _has_negative(row):
    for i in range(row.size):
        if row[i] < 0.0:
            return True
    return False


@cached_njit()
def _support_end(bits, no_positive):
    """1 + the index of the last entry that is not ±0.0 (0 for an all-zero row); whole blocks of 64, then 16
    entries first (a causal row's zero tail is often most of it)."""
    zero = no_positive - no_positive
    end = bits.size
    for width in (64, 16):
        while end >= width:
            seen = zero
            block = bits[end - width : end]
            for i in range(width):
                seen |= block[i] & no_positive  # clears the sign bit: −0.0 reads as 0
            if seen != zero:
                break
            end -= width
    while end > 0 and bits[end - 1] & no_positive == zero:
        end -= 1
    return end


@cached_njit()
def _span_threshold(bits, first, end, k_top, no_positive):
    """The smallest of the maxima of K equal slices of bits[first:end] (≤ 0 when a slice has no positive)."""
    zero = no_positive - no_positive
    width = (end - first + k_top - 1) // k_top
    threshold = no_positive
    for c in range(k_top):
        start = min(end, first + c * width)
        high = zero
        segment = bits[start : min(end, start + width)]
        for i in range(segment.size):
            high = max(high, segment[i])
        threshold = min(threshold, high)
    return threshold


@cached_njit()
def scan_row(row, bits, no_positive, exact_quantum, k_top):
    """Sum, support size, p_max, quantum q, end of support, validity, and the threshold and start of the top-K
    search (``top_k``) of one row, in one vectorised pass.

    ``bits`` is the row reinterpreted as signed integers of its width: on non-negative floats integer order is
    value order, so the support statistics are integer min/max/count reductions that vectorise, and −0.0 (a
    negative bit pattern) is told apart from true negatives by ``_has_negative``. ``no_positive`` is the largest
    integer of that width. Trailing ±0.0 (causal and padded rows) are skipped first, so ``end`` is one past the
    last entry that is not ±0.0 and the pass reads only [0, end). That span is cut into K slices; the smallest
    of the slice maxima is at most the K-th largest value, so only entries at or above it are top-K candidates
    (about 2.5·K on attention rows), and p_max is found in the slice holding the largest maximum. Rows settled
    by p_max alone (dominant atom) or by meet-in-the-middle never run the top-K search. Without
    ``exact_quantum`` the values are float32 numbers, so the unit in the last place of the smallest positive
    entry divides all of them. When that quantum leaves the sums unproved (ŝ > 2^52·q) but the lowest set bit over
    the row (a multiple of it) proves them, q is that lowest bit, as for float64 rows: a second pass checks that
    every entry is a multiple of the smallest power of two that would prove them, and stops at the first that is
    not (on attention rows, the first tiny entry with a full mantissa).

    Returns (ŝ, n, p_max, q, end, status, threshold, first).
    """
    end = _support_end(bits, no_positive)
    total = float64_sum(row[:end])  # the ±0.0 past ``end`` add exactly nothing
    zero = no_positive - no_positive
    lowest = zero
    smallest = no_positive
    n = 0
    threshold = no_positive
    highest = zero
    highest_slice = 0
    width = (end + k_top - 1) // k_top
    for c in range(k_top):
        start = min(end, c * width)
        stop = min(end, start + width)
        high = zero
        segment = bits[start:stop]  # indexed from 0, the loop vectorises (no negative-index wraparound checks)
        for i in range(segment.size):
            v = segment[i]
            positive = v > zero
            high = max(high, v)
            lowest = min(lowest, v)
            smallest = min(smallest, v if positive else no_positive)
            n += positive
        threshold = min(threshold, high)
        highest_slice = c if high > highest else highest_slice
        highest = max(highest, high)
    p_max = 0.0
    if highest > zero:
        i = highest_slice * width
        while bits[i] != highest:
            i += 1
        p_max = np.float64(row[i])
    first = 0
    if threshold <= zero and n > k_top:  # a slice without positives (leading or scattered zeros): cut the span
        while bits[first] <= zero:
            first += 1
        threshold = _span_threshold(bits, first, end, k_top, no_positive)
    threshold = max(threshold, zero + 1)
    status = _OK
    if not math.isfinite(total):
        status = _NON_FINITE
    elif lowest < zero and _has_negative(row):
        status = _NEGATIVE
    elif n == 0:
        status = _EMPTY
    q = np.inf
    if status == _OK:
        if exact_quantum:
            q = row_lowest_bit(row, end)
        else:
            # float32 bits: biased exponent f ≥ 1 has ulp 2^(f − 150); subnormals (f = 0) have ulp 2^-149.
            q = math.ldexp(1.0, max(int(np.int64(smallest) >> 23), 1) - 150)
            if not total <= math.ldexp(q, EXACT_SUM_QUANTA_LOG2) and total >= SMALLEST_EXACT_SUM:
                if _all_float32_multiples(bits, end, _proving_exponent(total)):
                    q = row_lowest_bit(row, end)
    return total, n, p_max, q, end, status, threshold, first


@cached_njit()
def top_k(row, bits, threshold, first, end, top_v, top_i):
    """The K largest positive values of row[first:end] into ``top_v``/``top_i``, descending (ties: earlier index
    first; unused slots −1), reading only entries whose bits are ≥ ``threshold`` (from ``scan_row``)."""
    for k in range(top_v.size):
        top_v[k] = -1.0
        top_i[k] = -1
    last = top_v.size - 1
    span = bits[first:end]
    for j in range(span.size):
        if span[j] >= threshold:
            x = np.float64(row[first + j])
            if x > top_v[last]:  # else it would change nothing: ties keep the earlier index
                _insert_top(top_v, top_i, x, first + j)
