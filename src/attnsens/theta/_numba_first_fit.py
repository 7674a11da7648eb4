"""The first-fit stages of the θ cascade (docs/theta-algorithms.md §3 step 5, §6 "Interleaved first-fit"), as
numba functions: the whole-row fill into t in key order and back from the last key, the fill by binade, and the
one-target fill into the best top-8 target, each run interleaved over a block's rows so that their chains of
dependent add/compare steps overlap in the pipeline. Distances follow the rounding model of ``_numba_kernels``.
"""

from __future__ import annotations

import math

import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta._constants import K_SMALL
from attnsens.theta._numba_refine import FREEZE_EVERY
from attnsens.theta._numba_scan import float64_sum

BINADES = 32
"""Binades of the binade first-fit below p_max's: values 2^-31·p_max and smaller share the last one."""


@cached_njit(inline="always")
def _fit_step(v0, v1, v2, v3, g0, g1, g2, g3, state):
    """One key of four first-fits: add it where it fits the target, else note the smallest key that overshot."""
    c0, c1, c2, c3, e0, e1, e2, e3 = state
    t0 = c0 + v0
    t1 = c1 + v1
    t2 = c2 + v2
    t3 = c3 + v3
    f0 = t0 <= g0
    f1 = t1 <= g1
    f2 = t2 <= g2
    f3 = t3 <= g3
    return (
        t0 if f0 else c0, t1 if f1 else c1, t2 if f2 else c2, t3 if f3 else c3,
        e0 if f0 else min(e0, v0), e1 if f1 else min(e1, v1), e2 if f2 else min(e2, v2), e3 if f3 else min(e3, v3),
    )  # fmt: skip


@cached_njit(inline="always")
def _next_skip(index, stop):
    return stop if index < 0 else index


@cached_njit(inline="always")
def _fill_distance(g, c, e):
    """d of a first-fit's state: the filled subset (gap g − c) or it plus the smallest key that overshot."""
    gap = g - c
    return min(gap, e - gap)


@cached_njit(inline="always")
def _freeze(frozen, d, stop_d):
    """A lane's result: fixed at the first check where d ≤ ``stop_d`` (∞ until then)."""
    return d if frozen == np.inf and d <= stop_d else frozen


@cached_njit()
def _first_fit_quad(x, rows, skip, targets, stop, stop_d, out):
    """One-target first-fit of four rows at once, state in registers, no data-dependent branches per key.

    A single first-fit is a chain of dependent add/compare steps (latency-bound); four independent chains
    overlap in the pipeline (docs/theta-algorithms.md §6 "Interleaved first-fit"). ``skip[a]`` lists the row's
    top-K indices in ascending order followed by −1; those keys read as 0, which always fits and changes nothing.
    The keys run in segments between consecutive skipped indices of any of the four rows, so the inner loop
    carries no checks.

    Every ``FREEZE_EVERY`` keys each lane checks its distance d = min(gap, overshoot): the first d ≤ ``stop_d``
    is that row's result (the subset filled so far, or it plus the smallest key that overshot), and the walk
    ends once all four rows have one. Rows that never get there run to ``stop``. A row's result depends on its
    own keys only, never on the rows it is grouped with.
    """
    row0 = x[rows[0]]
    row1 = x[rows[1]]
    row2 = x[rows[2]]
    row3 = x[rows[3]]
    g0 = targets[0]
    g1 = targets[1]
    g2 = targets[2]
    g3 = targets[3]
    state = (0.0, 0.0, 0.0, 0.0, np.inf, np.inf, np.inf, np.inf)
    f0 = f1 = f2 = f3 = np.inf
    k0 = 0
    k1 = 0
    k2 = 0
    k3 = 0
    i = 0
    check = FREEZE_EVERY
    while i < stop:
        s0 = _next_skip(skip[0, k0], stop)
        s1 = _next_skip(skip[1, k1], stop)
        s2 = _next_skip(skip[2, k2], stop)
        s3 = _next_skip(skip[3, k3], stop)
        segment_end = min(min(min(s0, s1), min(s2, s3)), check)
        # Views indexed from 0: no negative-index wraparound checks in the chain.
        a0 = row0[i:segment_end]
        a1 = row1[i:segment_end]
        a2 = row2[i:segment_end]
        a3 = row3[i:segment_end]
        for j in range(a0.size):
            state = _fit_step(np.float64(a0[j]), np.float64(a1[j]), np.float64(a2[j]), np.float64(a3[j]),
                              g0, g1, g2, g3, state)  # fmt: skip
        if segment_end >= stop:
            break
        i = segment_end
        if segment_end == check:
            c0, c1, c2, c3, e0, e1, e2, e3 = state
            f0 = _freeze(f0, _fill_distance(g0, c0, e0), stop_d)
            f1 = _freeze(f1, _fill_distance(g1, c1, e1), stop_d)
            f2 = _freeze(f2, _fill_distance(g2, c2, e2), stop_d)
            f3 = _freeze(f3, _fill_distance(g3, c3, e3), stop_d)
            if max(max(f0, f1), max(f2, f3)) < np.inf:
                break
            check += FREEZE_EVERY
            continue
        j = segment_end
        v0 = 0.0 if s0 == j else np.float64(row0[j])
        v1 = 0.0 if s1 == j else np.float64(row1[j])
        v2 = 0.0 if s2 == j else np.float64(row2[j])
        v3 = 0.0 if s3 == j else np.float64(row3[j])
        k0 += s0 == j
        k1 += s1 == j
        k2 += s2 == j
        k3 += s3 == j
        state = _fit_step(v0, v1, v2, v3, g0, g1, g2, g3, state)
        i = j + 1
    c0, c1, c2, c3, e0, e1, e2, e3 = state
    out[0] = f0 if f0 < np.inf else _fill_distance(g0, c0, e0)
    out[1] = f1 if f1 < np.inf else _fill_distance(g1, c1, e1)
    out[2] = f2 if f2 < np.inf else _fill_distance(g2, c2, e2)
    out[3] = f3 if f3 < np.inf else _fill_distance(g3, c3, e3)


@cached_njit(inline="always")
def _fill_whole_blocks(row, end, g, reverse):
    """The whole-block phase of the whole-row first-fit: (total, keys) after adding the blocks of ``FREEZE_EVERY``
    keys of row[:end], from the first on (or, ``reverse``, from the last back), each by one vectorised sum, while
    they fit into g; ``keys`` is how many keys those blocks hold."""
    filled = 0.0
    i = 0
    while i + FREEZE_EVERY <= end:
        block = float64_sum(row[end - i - FREEZE_EVERY : end - i] if reverse else row[i : i + FREEZE_EVERY])
        if filled + block > g:
            break
        filled += block
        i += FREEZE_EVERY
    return filled, i


@cached_njit()
def _whole_row_first_fits(x, r0, rows, n_rows, ends, row_sum, stop_d, reverse, out_d):
    """First-fit of each row x[r0 + rows[a], :ends[rows[a]]] in key order (``reverse``: from its last key back to its
    first) into the capacity t = ŝ/2; out_d[a] is its distance min(gap, e_min − gap).

    While a row's running total stays below t every key fits, so whole blocks of ``FREEZE_EVERY`` keys are added
    by one vectorised sum each as long as the block fits (``_fill_whole_blocks``). From the first block that does
    not, keys go one by one, each added if it still fits, the smallest that did not remembered, and every
    ``FREEZE_EVERY`` keys the walk ends once the distance is ≤ ``stop_d``. That walk is a chain of dependent
    add/compare steps, so four rows walk at once (``_fit_step``), ``FREEZE_EVERY`` keys a turn, and a lane whose
    row has ended takes the next row (docs/theta-algorithms.md §6 "Interleaved first-fit"): on SmolLM2's rows at
    2048 tokens the walk takes about two thirds of the time one row at a time takes. Each row's steps, and so
    its result, are those of a walk on its own: a lane without a row, or past its row's end, adds +0.0, which
    fits and changes nothing. The filled subset's sum is one float64 sum of its values (block sums, then the sum
    of those and single keys), within the rounding model of this module.
    """
    filled = np.zeros(4)
    smallest_over = np.full(4, np.inf)
    capacity = np.zeros(4)
    position = np.zeros(4, np.int64)
    lane_row = np.full(4, -1, np.int64)
    keys = np.zeros((4, FREEZE_EVERY))
    taken = 0
    while True:
        busy = False
        for lane in range(4):
            while lane_row[lane] < 0 and taken < n_rows:
                a = taken
                taken += 1
                j = rows[a]
                g = 0.5 * row_sum[r0 + j]
                total, i = _fill_whole_blocks(x[r0 + j], ends[j], g, reverse)
                if i >= ends[j]:  # every key fitted: no walk
                    out_d[a] = _fill_distance(g, total, np.inf)
                    continue
                lane_row[lane] = a
                filled[lane] = total
                smallest_over[lane] = np.inf
                capacity[lane] = g
                position[lane] = i
            a = lane_row[lane]
            size = 0
            if a >= 0:
                busy = True
                j = rows[a]
                i = position[lane]
                end = ends[j]
                if reverse:  # the keys before the last i, latest first
                    segment = x[r0 + j, max(0, end - i - FREEZE_EVERY) : end - i]
                    size = segment.size
                    for k in range(size):
                        keys[lane, k] = np.float64(segment[size - 1 - k])
                else:
                    segment = x[r0 + j, i : min(end, i + FREEZE_EVERY)]
                    size = segment.size
                    for k in range(size):
                        keys[lane, k] = np.float64(segment[k])
            for k in range(size, FREEZE_EVERY):
                keys[lane, k] = 0.0
        if not busy:
            return
        state = (
            filled[0], filled[1], filled[2], filled[3],
            smallest_over[0], smallest_over[1], smallest_over[2], smallest_over[3],
        )  # fmt: skip
        g0, g1, g2, g3 = capacity[0], capacity[1], capacity[2], capacity[3]
        for k in range(FREEZE_EVERY):
            state = _fit_step(keys[0, k], keys[1, k], keys[2, k], keys[3, k], g0, g1, g2, g3, state)
        (
            filled[0], filled[1], filled[2], filled[3],
            smallest_over[0], smallest_over[1], smallest_over[2], smallest_over[3],
        ) = state  # fmt: skip
        for lane in range(4):
            a = lane_row[lane]
            if a >= 0:
                position[lane] += FREEZE_EVERY
                d = _fill_distance(capacity[lane], filled[lane], smallest_over[lane])
                if position[lane] >= ends[rows[a]] or d <= stop_d:
                    out_d[a] = d
                    lane_row[lane] = -1
                    filled[lane] = 0.0
                    capacity[lane] = 0.0


@cached_njit(inline="always")
def _binade(bits_j, shift, top_exponent):
    """The binade of a value below the row's largest: 0 for p_max's own, k for k exponents lower, capped at the
    last (which also holds the zeros and −0.0, whose exponent field reads as 0 or negative); unsigned, so that
    indexing with it needs no wraparound check."""
    return np.uint64(min(max(top_exponent - np.int64(bits_j >> shift), 0), BINADES - 1))


@cached_njit()
def _binade_first_fit(row, bits, end, t, stop_d, shift, bias, top_exponent, counts, masses, grouped):
    """First-fit decreasing by binade: the keys of row[:end] go into the capacity t binade by binade, largest
    first (key order within a binade); returns the distance min(gap, e_min − gap) of the filled subset, or of it
    plus the smallest key that did not fit.

    Filling the large values first and the small ones last is what ends near t: whatever gap is left is smaller
    than the smallest value that did not fit, and those come last. Key order instead often spends the small values
    while the total is still far below t (the attention sink of a causal row comes first). On SmolLM2's long
    rows at 512 tokens the key-order fill leaves 46 % above the stop distance; this settles 95 % of those.

    One pass counts each binade's keys and sums its values (four interleaved histograms, so that consecutive keys
    of one binade do not wait on each other); whole binades are added while they fit. From the first binade that
    does not fit, a second pass groups the values of that binade and the smaller ones, and each binade is then
    added whole if it fits, skipped if even its smallest possible value exceeds the gap (only its smallest value
    counts, as an overshoot), or filled key by key. The filled total is a float64 sum of distinct values (binade
    sums, then single values), within the rounding model of this module. ``shift`` and ``bias`` are the mantissa
    width and exponent bias of the row's float format; ``top_exponent`` is p_max's biased exponent; ``counts``
    (int64), ``masses`` (float64) of ``BINADES * 4`` entries and ``grouped`` (≥ end float64) are scratch.
    """
    counts[:] = 0
    masses[:] = 0.0
    span_bits = bits[:end]
    span = row[:end]
    body = end - end % 4
    for j in range(0, body, 4):
        for lane in range(4):
            slot = _binade(span_bits[j + lane], shift, top_exponent) * np.uint64(4) + np.uint64(lane)
            counts[slot] += 1
            masses[slot] += np.float64(span[j + lane])
    for j in range(body, end):
        slot = _binade(span_bits[j], shift, top_exponent) * np.uint64(4)
        counts[slot] += 1
        masses[slot] += np.float64(span[j])
    filled = 0.0
    first_partial = BINADES
    for b in range(BINADES):
        mass = (masses[4 * b] + masses[4 * b + 1]) + (masses[4 * b + 2] + masses[4 * b + 3])
        masses[4 * b] = mass
        if first_partial == BINADES:
            if filled + mass <= t:
                filled += mass
            else:
                first_partial = b
    if first_partial == BINADES:  # only an empty row gets here
        return t - filled
    # Offsets of each (binade, lane) group among the values of the binades from first_partial on.
    total = 0
    for slot in range(4 * first_partial, 4 * BINADES):
        size = counts[slot]
        counts[slot] = total
        total += size
    first_slot = np.uint64(4 * first_partial)
    for j in range(0, body, 4):
        for lane in range(4):
            slot = _binade(span_bits[j + lane], shift, top_exponent) * np.uint64(4) + np.uint64(lane)
            if slot >= first_slot:
                grouped[counts[slot]] = np.float64(span[j + lane])
                counts[slot] += 1
    for j in range(body, end):
        slot = _binade(span_bits[j], shift, top_exponent) * np.uint64(4)
        if slot >= first_slot:
            grouped[counts[slot]] = np.float64(span[j])
            counts[slot] += 1
    smallest_over = np.inf
    start = 0
    for b in range(first_partial, BINADES):
        stop = counts[4 * b + 3]  # after the second pass: one past the binade's last value
        values = grouped[start:stop]
        start = stop
        if values.size == 0:
            continue
        if b > first_partial and filled + masses[4 * b] <= t:
            filled += masses[4 * b]
            continue
        floor = math.ldexp(1.0, top_exponent - b - bias) if b < BINADES - 1 and top_exponent - b > 0 else 0.0
        if t - filled < floor:  # none fits: only the smallest can be the overshoot
            smallest = values[0]
            for i in range(1, values.size):
                smallest = min(smallest, values[i])
            smallest_over = min(smallest_over, smallest)
            continue
        for i in range(values.size):
            v = values[i]
            trial = filled + v
            fits = trial <= t
            filled = trial if fits else filled
            smallest_over = smallest_over if fits else min(smallest_over, v)
        if _fill_distance(t, filled, smallest_over) <= stop_d:
            break
    return _fill_distance(t, filled, smallest_over)


@cached_njit()
def _interleaved_first_fit(x, r0, pending, n_pending, skip, targets, ends, stop_d, out_d):
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
        _first_fit_quad(x, rows, quad_skip, quad_targets, stop, stop_d, quad_out)
        for a in range(min(4, n_pending - start)):
            out_d[start + a] = quad_out[a]


@cached_njit()
def _sort_into(values, out):
    """out[:len(values)] = values in ascending order (insertion sort of at most K entries; no allocation)."""
    for a in range(values.size):
        v = values[a]
        k = a
        while k > 0 and out[k - 1] > v:
            out[k] = out[k - 1]
            k -= 1
        out[k] = v
