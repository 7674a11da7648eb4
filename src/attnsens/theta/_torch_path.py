"""Pure-torch θ cascade: the vectorised pieces of docs/theta-algorithms.md §3 for any device, without numba.

Same mathematics and the same rounding model as ``_numba_kernels`` (its module docstring): exact
meet-in-the-middle for small supports, dominant atom, top-8 relaxation (exact when d_lb > 0, else the upper
bound), the cardinality bound and, on rows of at most 48 keys, its three-group form (exact when positive),
first-fit of the tail in original order into the 16 best
top-8 targets (a loop over key columns, vectorised over rows), then greedy balancing in descending order (LPT)
refined by best single exchanges, and plain LPT for what is left. No Karmarkar–Karp, no CKK and no split over
the multiplicities of repeated values, so intervals can be wider than the numba path's (rows of a few repeated
values: up to about 5·10^-5), never unsound.
"""

from __future__ import annotations

import torch

from attnsens._float64 import UNIT_ROUNDOFF
from attnsens.theta._constants import (
    ERROR_RADIUS_OFFSET,
    ERROR_RADIUS_PER_KEY,
    ERROR_RADIUS_SLACK,
    EXACT_SUM_QUANTA_LOG2,
    K_SMALL,
    LOWEST_BIT_MAX_SUPPORT,
    N_TARGETS,
    SMALLEST_EXACT_SUM,
    SWAP_ROUNDS,
)
from attnsens.theta._validation import row_status
from attnsens.theta.methods import ThetaMethod

MITM_CHUNK_ELEMENTS = 1 << 22
GROUP_BOUND_MAX_SUPPORT = 48
"""Rows of at most this many non-zeros that the cardinality bound leaves open get its three-group form (the
numba path's ``prove_short_row`` applies it to the same rows)."""
GROUP_BOUND_CHUNK_ROWS = 256


def certify_rows_torch(
    rows: torch.Tensor, stop_distance: float, mitm_max_support: int, check_sum: bool, tolerance: float
) -> dict[str, torch.Tensor]:
    """Per-row ŝ, p_max, d̂, d̂_lb, E, method and status for ``rows`` [row, key] (see ``certify_rows``)."""
    status, _ = row_status(rows, check_sum=check_sum, tolerance=tolerance)
    x = torch.where(status.unsqueeze(-1) == 0, rows.to(torch.float64), torch.zeros((), dtype=torch.float64,
                                                                                     device=rows.device))  # fmt: skip
    n_rows, n_keys = x.shape
    s = x.sum(-1)
    t = 0.5 * s
    positive = x > 0
    n = positive.sum(-1)
    p_max = x.amax(-1) if n_keys > 0 else s
    q = _quantum(x, positive, s, n, exact_quantum=rows.dtype == torch.float64)
    err = _error_radius(s, n, q)

    method = torch.zeros(n_rows, dtype=torch.int8, device=x.device)
    valid = status == 0
    done = ~valid

    k_small = min(K_SMALL, n_keys)
    top_v, top_i = x.topk(k_small, dim=-1)
    sums = _subset_sums(top_v)
    rest = (s - top_v.sum(-1)).unsqueeze(-1)
    lo = sums - t.unsqueeze(-1)
    hi = t.unsqueeze(-1) - (sums + rest)
    d_found = torch.minimum(lo.abs(), hi.abs()).amin(-1)
    d_lb = torch.where(lo > 0, lo, torch.where(hi > 0, hi, torch.zeros_like(lo))).amin(-1)

    small = ~done & (n <= mitm_max_support)
    if small.any():
        idx = torch.nonzero(small).flatten()
        d_small = _meet_in_the_middle(x[idx], t[idx], min(mitm_max_support, n_keys))
        d_found = d_found.index_put((idx,), d_small)
        d_lb = d_lb.index_put((idx,), d_small)
        method = _mark(method, small, ThetaMethod.MEET_IN_THE_MIDDLE)
        done |= small

    dominant = ~done & (p_max - t > err)
    d_found = torch.where(dominant, p_max - t, d_found)
    d_lb = torch.where(dominant, p_max - t, d_lb)
    method = _mark(method, dominant, ThetaMethod.DOMINANT_ATOM)
    done |= dominant

    k_atom = ~done & (d_lb > err)
    d_found = torch.where(k_atom, d_lb, d_found)
    method = _mark(method, k_atom, ThetaMethod.K_ATOM_RELAXATION)
    done |= k_atom

    if not done.all():
        idx = torch.nonzero(~done).flatten()
        d_card = _cardinality_bound(x[idx], sums[idx], t[idx], k_small)
        d_found, d_lb, method, done = _apply_cardinality_bound(idx, d_card, err, d_found, d_lb, method, done)

    grouped_rows = ~done & (n <= GROUP_BOUND_MAX_SUPPORT)
    if grouped_rows.any():
        idx = torch.nonzero(grouped_rows).flatten()
        d_group = _group_cardinality_bound(x[idx], t[idx], min(GROUP_BOUND_MAX_SUPPORT, n_keys))
        d_found, d_lb, method, done = _apply_cardinality_bound(idx, d_group, err, d_found, d_lb, method, done)

    heuristics = (
        (ThetaMethod.FIRST_FIT_SIXTEEN_TARGETS, lambda i: _first_fit(x[i], top_i[i], sums[i], t[i], rest[i])),
        (ThetaMethod.SWAP_DESCENT, lambda i: _greedy_with_exchanges(x[i], t[i], stop_distance)),
        (ThetaMethod.SORTED_GREEDY, lambda i: _sorted_greedy(x[i])),
    )
    for stage, (code, heuristic) in enumerate(heuristics):
        if done.all():
            break
        idx = torch.nonzero(~done).flatten()
        d_found = d_found.index_put((idx,), torch.minimum(d_found[idx], heuristic(idx)))
        perfect = ~done & (err == 0) & (2.0 * d_found <= q)
        d_lb = torch.where(perfect, d_found, d_lb)
        method = _mark(method, perfect, ThetaMethod.PERFECT_PARTITION)
        done |= perfect
        reached = ~done & (d_found <= stop_distance) if stage < len(heuristics) - 1 else ~done
        method = _mark(method, reached, code)
        done |= reached
    return {"row_sum": s, "p_max": p_max, "d_found": d_found, "d_lb": d_lb, "err": err, "method": method,
            "status": status}  # fmt: skip


def _apply_cardinality_bound(
    idx: torch.Tensor,
    bound: torch.Tensor,
    err: torch.Tensor,
    d_found: torch.Tensor,
    d_lb: torch.Tensor,
    method: torch.Tensor,
    done: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold a cardinality lower bound on d* of rows ``idx`` into (d_found, d_lb, method, done): rows where it
    exceeds E are proved (d* = the bound, ``CARDINALITY_BOUND``), the others keep it as their lower bound."""
    proved = bound > err[idx]
    d_found = d_found.index_put((idx,), torch.where(proved, bound, d_found[idx]))
    d_lb = d_lb.index_put((idx,), torch.maximum(d_lb[idx], bound))
    settled = torch.zeros_like(done).index_put((idx,), proved)
    return d_found, d_lb, _mark(method, settled, ThetaMethod.CARDINALITY_BOUND), done | settled


def _mark(method: torch.Tensor, rows: torch.Tensor, code: ThetaMethod) -> torch.Tensor:
    return torch.where(rows, torch.tensor(int(code), dtype=torch.int8, device=method.device), method)


def _quantum(
    x: torch.Tensor, positive: torch.Tensor, s: torch.Tensor, n: torch.Tensor, *, exact_quantum: bool
) -> torch.Tensor:
    """A power of two dividing every value of the row: the lowest set bit (float64 input), or 2^(e_min − 24) for
    float32 input, replaced by the lowest set bit where only that one proves the sums (ŝ ≤ 2^52·q;
    ``_numba_scan.scan_row``) and on rows of at most ``LOWEST_BIT_MAX_SUPPORT`` non-zeros (``_numba_kernels``);
    ``positive`` is x > 0 and ``n`` its count per row."""
    inf = torch.full_like(x, torch.inf)
    mantissa, exponent = torch.frexp(x)
    bits = (mantissa * 2.0**53).to(torch.int64)
    lowest = torch.ldexp((bits & -bits).to(torch.float64), (exponent - 53).to(torch.float64))
    lowest_bit = torch.where(positive, lowest, inf).amin(-1)
    if exact_quantum:
        return lowest_bit
    p_min = torch.where(positive, x, inf).amin(-1)
    _, exponent = torch.frexp(torch.where(torch.isfinite(p_min), p_min, torch.ones_like(p_min)))
    ulp = torch.ldexp(torch.ones_like(p_min), (exponent - 24).to(torch.float64))
    only_lowest = (s > ulp * 2.0**EXACT_SUM_QUANTA_LOG2) & (s <= lowest_bit * 2.0**EXACT_SUM_QUANTA_LOG2)
    return torch.where(only_lowest | (n <= LOWEST_BIT_MAX_SUPPORT), lowest_bit, ulp)


def _error_radius(s: torch.Tensor, n: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """E of ``_numba_kernels``: 0 when sums are error-free (s ≤ 2^52·q), else (2n + 16)·u·s·(1 + 2^-10)."""
    exact_sums = (s >= SMALLEST_EXACT_SUM) & (s <= q * 2.0**EXACT_SUM_QUANTA_LOG2)
    radius = ERROR_RADIUS_PER_KEY * n.to(torch.float64) + ERROR_RADIUS_OFFSET
    bound = radius * UNIT_ROUNDOFF * s * ERROR_RADIUS_SLACK
    return torch.where(exact_sums, torch.zeros_like(s), bound)


def _subset_sums(values: torch.Tensor) -> torch.Tensor:
    """[row, 2^k]: sums[:, T] = Σ_{j ∈ T} values[:, j] for every bitmask T (doubling, same order as numba)."""
    sums = torch.zeros(values.shape[0], 1, dtype=values.dtype, device=values.device)
    for j in range(values.shape[-1]):
        sums = torch.cat([sums, sums + values[:, j : j + 1]], dim=-1)
    return sums


def _meet_in_the_middle(x: torch.Tensor, t: torch.Tensor, width: int) -> torch.Tensor:
    """Exact d* for rows with ≤ ``width`` non-zeros: sorted half-sums, nearest partner by ``searchsorted``."""
    vals = x.topk(width, dim=-1).values
    half = width // 2
    per_row = 1 << max(half, width - half)
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    chunk = max(1, MITM_CHUNK_ELEMENTS // per_row)
    for start in range(0, x.shape[0], chunk):
        v = vals[start : start + chunk]
        tt = t[start : start + chunk].unsqueeze(-1)
        a = _subset_sums(v[:, :half]).sort(-1).values.contiguous()
        b = _subset_sums(v[:, half:])
        pos = torch.searchsorted(a, (tt - b).contiguous())
        best = torch.full_like(tt.squeeze(-1), torch.inf)
        for candidate in (pos - 1, pos):
            ok = (candidate >= 0) & (candidate < a.shape[-1])
            partner = a.gather(-1, candidate.clamp(0, a.shape[-1] - 1))
            dist = torch.where(ok, ((partner + b) - tt).abs(), torch.full_like(b, torch.inf))
            best = torch.minimum(best, dist.amin(-1))
        out[start : start + chunk] = best
    return out


def _cardinality_bound(x: torch.Tensor, sums: torch.Tensor, t: torch.Tensor, k_small: int) -> torch.Tensor:
    """d_lb of ``_numba_cardinality.cardinality_relaxation`` per row: the least distance from t − p(T) to
    [L_k, U_k] over the subsets T of the top-K values (``sums`` [row, 2^K]) and the counts k of the others.

    L_k and U_k (sums of the k smallest / largest others) are cumulative sums of the sorted values, so every
    distance is t − p(T) minus one plain sum of distinct values (the rounding model of ``_numba_kernels``).
    """
    tail = x.sort(-1, descending=True).values[:, k_small:]
    zero = torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device)
    largest = torch.cat([zero, tail.cumsum(-1)], -1)  # [row, m + 1]; flat past the support
    ascending = torch.where(tail > 0, tail, torch.inf).sort(-1).values
    smallest = torch.cat([zero, torch.where(ascending < torch.inf, ascending, 0.0).cumsum(-1)], -1)
    g = (t.unsqueeze(-1) - sums).contiguous()  # [row, 2^K]
    k = (torch.searchsorted(smallest.contiguous(), g, right=True) - 1).clamp(min=0)  # largest k with L_k ≤ g
    below = g - largest.gather(-1, k)
    m = tail.shape[-1]
    above = torch.where(k < m, smallest.gather(-1, (k + 1).clamp(max=m)) - g, torch.inf)
    inside = torch.where(below > 0, torch.minimum(below, above), torch.zeros_like(g))
    return torch.where(g <= 0, -g, inside).amin(-1)


def _group_cardinality_bound(x: torch.Tensor, t: torch.Tensor, width: int) -> torch.Tensor:
    """d_lb of ``_numba_cardinality.group_cardinality_bound`` per row of at most ``width`` non-zeros: the sorted
    values cut at their two largest gaps into groups A > B > C (the first of equal gaps, as there), and the least
    distance from t to [L_a + L_b + L_c, U_a + U_b + U_c] over every count (a, b, c) of keys taken from each group
    (L / U: sums of the smallest / largest keys of the group), summed in the same order as the numba form.

    The counts a run in a loop; each step covers every (b, c) of every row at once ([row, width + 1, width + 1]),
    in blocks of ``GROUP_BOUND_CHUNK_ROWS`` rows.
    """
    vals = x.topk(width, dim=-1).values  # descending; zeros after the support
    n = (vals > 0).sum(-1)
    keys = torch.arange(width, device=x.device)
    gaps = torch.where(keys[:-1] < (n - 1).unsqueeze(-1), vals[:, :-1] - vals[:, 1:], -1.0)
    first = gaps.argmax(-1)  # torch.argmax: the first of equal maxima
    second = torch.where(keys[:-1] == first.unsqueeze(-1), -2.0, gaps).argmax(-1)
    cut_1 = torch.minimum(first, second) + 1
    cut_2 = torch.maximum(first, second) + 1
    cut_1 = torch.where(n > 1, cut_1, n)
    cut_2 = torch.where(n > 1, cut_2, n)
    zero = torch.zeros_like(cut_1)
    groups = [_group_prefix_sums(vals, lo, hi, width) for lo, hi in ((zero, cut_1), (cut_1, cut_2), (cut_2, n))]
    (small_a, large_a, size_a), (small_b, large_b, size_b), (small_c, large_c, size_c) = groups
    counts = torch.arange(width + 1, device=x.device)
    best = torch.full_like(t, torch.inf)
    for start in range(0, x.shape[0], GROUP_BOUND_CHUNK_ROWS):
        rows = slice(start, start + GROUP_BOUND_CHUNK_ROWS)
        tt = t[rows].view(-1, 1, 1)
        valid_bc = (counts.view(1, -1, 1) <= size_b[rows].view(-1, 1, 1)) & (
            counts.view(1, 1, -1) <= size_c[rows].view(-1, 1, 1)
        )
        chunk_best = best[rows]
        for a in range(int(size_a[rows].max()) + 1):
            low = (small_a[rows, a].view(-1, 1, 1) + small_b[rows].unsqueeze(-1)) + small_c[rows].unsqueeze(-2)
            high = (large_a[rows, a].view(-1, 1, 1) + large_b[rows].unsqueeze(-1)) + large_c[rows].unsqueeze(-2)
            dist = torch.where(low > tt, low - tt, torch.where(high < tt, tt - high, torch.zeros_like(low)))
            valid = valid_bc & (a <= size_a[rows]).view(-1, 1, 1)
            dist = torch.where(valid, dist, torch.full_like(dist, torch.inf))
            chunk_best = torch.minimum(chunk_best, dist.flatten(1).amin(-1))
        best[rows] = chunk_best
    return best


def _group_prefix_sums(
    vals: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(smallest, largest, size): [row, width + 1] sums of the k smallest / largest of vals[lo:hi] (descending),
    k = 0 … width (held at the group's total past its size), and the group's size."""
    size = hi - lo
    k = torch.arange(width, device=vals.device).unsqueeze(0)
    inside = k < size.unsqueeze(-1)
    largest_first = vals.gather(-1, (lo.unsqueeze(-1) + k).clamp(max=width - 1))
    smallest_first = vals.gather(-1, (hi.unsqueeze(-1) - 1 - k).clamp(min=0))
    zero = torch.zeros(vals.shape[0], 1, dtype=vals.dtype, device=vals.device)
    largest = torch.cat([zero, torch.where(inside, largest_first, 0.0).cumsum(-1)], -1)
    smallest = torch.cat([zero, torch.where(inside, smallest_first, 0.0).cumsum(-1)], -1)
    return smallest, largest, size


def _first_fit(
    x: torch.Tensor, top_i: torch.Tensor, sums: torch.Tensor, t: torch.Tensor, rest: torch.Tensor
) -> torch.Tensor:
    """Best d of first-fit (original order, top-8 removed) into the 16 targets t − p(T) ∈ [0, r] nearest r/2."""
    g = t.unsqueeze(-1) - sums
    feasible = (g >= 0) & (g <= rest)
    score = torch.where(feasible, (g - 0.5 * rest).abs(), torch.full_like(g, torch.inf))
    pick = score.topk(min(N_TARGETS, g.shape[-1]), dim=-1, largest=False).indices
    targets = g.gather(-1, pick)
    usable = feasible.gather(-1, pick)
    tail = x.scatter(-1, top_i, 0.0)
    fill = torch.zeros_like(targets)
    e_min = torch.full_like(targets, torch.inf)
    for column in tail.unbind(-1):
        v = column.unsqueeze(-1)
        c = fill + v
        fits = c <= targets
        fill = torch.where(fits, c, fill)
        e_min = torch.where(fits, e_min, torch.minimum(e_min, v))
    gap = targets - fill
    d = torch.minimum(gap, e_min - gap)
    return torch.where(usable, d, torch.full_like(d, torch.inf)).amin(-1)


def _lpt_split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each value of the descending ``values`` [row, key] to the lighter side (LPT): (in first side, A, B)."""
    in_s = torch.zeros_like(values, dtype=torch.bool)
    side_a = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    side_b = torch.zeros_like(side_a)
    for j, column in enumerate(values.unbind(-1)):
        to_a = side_a <= side_b
        in_s[:, j] = to_a
        side_a = torch.where(to_a, side_a + column, side_a)
        side_b = torch.where(to_a, side_b, side_b + column)
    return in_s, side_a, side_b


def _sorted_greedy(x: torch.Tensor) -> torch.Tensor:
    """Descending order, each value to the lighter side (LPT): d = |A − B|/2 ≤ ‖p‖₂ / 2 (docs/math.md T2(c))."""
    _, side_a, side_b = _lpt_split(x.sort(-1, descending=True).values)
    return 0.5 * (side_a - side_b).abs()


def _greedy_with_exchanges(x: torch.Tensor, t: torch.Tensor, stop_distance: float) -> torch.Tensor:
    """LPT split, then up to ``SWAP_ROUNDS`` best single exchanges per row (``_numba_partition.swap_descent``).

    Returns d = |p(S) − t| of the final subset of every row, p(S) one float64 sum of S's values. The best pair
    (a ∈ S, b ∉ S) with b − a closest to the gap is found by searching each a + gap among the sorted values
    outside S (entries not available on a side are parked at ±∞, so they never pair).
    """
    values = x.sort(-1, descending=True).values
    in_s, _, _ = _lpt_split(values)
    for round_ in range(SWAP_ROUNDS + 1):
        gap = t - torch.where(in_s, values, 0.0).sum(-1)
        d = gap.abs()
        open_rows = d > stop_distance
        if round_ == SWAP_ROUNDS or not bool(open_rows.any()):
            break
        outside, where_out = torch.where(in_s, torch.inf, values).sort(-1)
        wanted = torch.where(in_s, values + gap.unsqueeze(-1), -torch.inf).contiguous()
        upper = torch.searchsorted(outside, wanted).clamp(max=values.shape[-1] - 1)
        best_miss = d.clone()
        best_a = torch.full_like(d, -1, dtype=torch.long)
        best_b = torch.full_like(best_a, -1)
        for candidate in (upper - 1).clamp(min=0), upper:
            b_values = outside.gather(-1, candidate)
            miss = (gap.unsqueeze(-1) - (b_values - values)).abs()
            miss = torch.where(in_s & torch.isfinite(b_values), miss, torch.inf)
            row_miss, a = miss.min(-1)
            better = open_rows & (row_miss < best_miss)
            best_miss = torch.where(better, row_miss, best_miss)
            best_a = torch.where(better, a, best_a)
            best_b = torch.where(
                better, where_out.gather(-1, candidate.gather(-1, a.unsqueeze(-1))).squeeze(-1), best_b
            )
        moving = torch.nonzero(best_a >= 0).flatten()
        if moving.numel() == 0:
            break
        in_s[moving, best_a[moving]] = False
        in_s[moving, best_b[moving]] = True
    return d
