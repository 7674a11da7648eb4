"""Triton θ certificate: the one-pass stage of the cascade on the GPU, a few rows per program.

Design: docs/theta-algorithms.md §7.

Each program loads its rows once, keeps them in registers and produces the same five per-row numbers as the CPU
kernels (ŝ, p_max, d̂, d̂_lb, E; ``_numba_kernels`` docstring) plus the method and the validation status:

    sum, support size, p_max and the row quantum q      (float64 accumulation)
    top-8 by 8 masked argmax rounds, the 256 top-8 subset sums → d_lb, the endpoint subsets, the target
        g = t − p(T) ∈ [0, r] nearest r/2               (dominant atom / K-atom exact regimes, §1)
    tail fill without a sort ("pbf", §3): prefix of the tail in original order up to the first element that
        overflows g, then ``ROUNDS`` rounds "largest unused tail element ≤ gap", then the best single overshoot;
        rows still open after one target get a second launch (compacted) with the 16 best targets.

Every distance is the absolute value of a computed signed sum of distinct stored values and t = ŝ/2 with at
most n + 16 float64 additions (scan and tree reductions included), so the rounding radius E of the CPU kernels
applies unchanged and ``theta_enclosure`` turns the numbers into a rigorous interval. Rows both launches leave
open go through the stages that vectorise over rows, in torch on the device (``device_stages``):
meet-in-the-middle for supports ≤ ``mitm_max_support``, the cardinality bound, LPT with exchanges. Rows none of
this can finish (best d above the stop distance and not proved exact) keep method 0 and are finished by the CPU
cascade passed in as ``finish``.

The float32 quantum is the CPU kernels': 2^(e_min − 24), or the lowest set bit over the row where that leaves the
sums unproved (ŝ > 2^52·q; a subnormal p_min has 2^-149, which divides every float32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

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
)
from attnsens.theta._torch_path import (
    GROUP_BOUND_MAX_SUPPORT,
    _cardinality_bound,
    _greedy_with_exchanges,
    _group_cardinality_bound,
    _meet_in_the_middle,
    _quantum,
    _subset_sums,
)
from attnsens.theta.methods import RowStatus, ThetaMethod

BEST_FIT_ROUNDS = 8
REFINE_TARGETS = N_TARGETS
"""Targets of the second pass, run only on the rows the first (one-target) pass leaves open (tkff M = 16, §3)."""
MAX_KEYS = 16384
"""Longest row kept in registers; longer rows go to ``finish`` whole."""
EXACT_FIRST_MAX_SUPPORT = 128
"""Rows of 25–128 keys the cardinality bound leaves open go to ``finish`` without the exchanges: there the CPU
cascade runs the stages that can end exact first (``_numba_refine.prove_short_row``, Karmarkar–Karp, the
cardinality-pruned search), where the exchanges would stop at the stop distance."""

RowCascade = Callable[[torch.Tensor], dict[str, torch.Tensor]]


@triton.jit
def _pow2(k):
    """2^k as float64 for integer k in [−1022, 1023], built from the exponent bits."""
    return ((k + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _log2_quantum(raw, x, s, positive, n, EXACT_QUANTUM: tl.constexpr, QUANTA_LOG2: tl.constexpr,
                  LOWEST_BIT_SUPPORT: tl.constexpr):  # fmt: skip
    """Per row, log2 of a power of two q dividing every value of the row (int64).

    float64 rows: the lowest set mantissa bit over the row; float32 rows: 2^(e_min − 24) from the smallest
    non-zero (2^-149 when it is subnormal), replaced by the lowest set bit where only that one proves ŝ ≤ 2^52·q
    and on rows of at most LOWEST_BIT_SUPPORT non-zeros (``_constants.LOWEST_BIT_MAX_SUPPORT``).
    """
    bits = x.to(tl.int64, bitcast=True)
    biased = (bits >> 52) & 0x7FF
    mantissa = bits & 0xFFFFFFFFFFFFF
    mantissa = tl.where(biased > 0, mantissa | (1 << 52), mantissa)
    lowest = (mantissa & (-mantissa)).to(tl.float64)
    lowest_exp = ((lowest.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    per_key = lowest_exp + tl.maximum(biased, 1) - 1075
    lowest_bit = tl.min(tl.where(positive, per_key, 1 << 20), axis=1)
    if EXACT_QUANTUM:
        return lowest_bit
    p_min = tl.min(tl.where(positive, raw, float("inf")), axis=1)
    biased_min = (p_min.to(tl.int32, bitcast=True) >> 23) & 0xFF
    ulp = (tl.maximum(biased_min, 1) - 150).to(tl.int64)
    by_ulp = s <= _pow2(tl.minimum(tl.maximum(ulp + QUANTA_LOG2, -1022), 1023))
    by_lowest = s <= _pow2(tl.minimum(tl.maximum(lowest_bit + QUANTA_LOG2, -1022), 1023))
    return tl.where((~by_ulp & by_lowest) | (n <= LOWEST_BIT_SUPPORT), lowest_bit, ulp)


@triton.jit
def _tail_fill(x, tail, keys, g, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    """Best d of the "pbf" fill of the tail into capacity g per row ([ROWS] float64).

    Prefix of the tail in original order up to the first element that overflows g (one scan), then ``ROUNDS``
    rounds "add the largest unused tail element ≤ gap", then the best single unused element added on top.
    """
    prefix = tl.cumsum(tl.where(tail, x, 0.0), axis=1)
    first_over = tl.min(tl.where(tail & (prefix > g[:, None]), keys, BLOCK), axis=1)
    fill = tl.sum(tl.where(keys == first_over[:, None] - 1, prefix, 0.0), axis=1)
    used = tail & (keys < first_over[:, None])
    gap = g - fill
    for _ in tl.static_range(ROUNDS):
        candidates = tl.where(tail & (~used) & (x <= gap[:, None]), x, -1.0)
        v, i = tl.max(candidates, axis=1, return_indices=True)
        used = used | ((keys == i[:, None]) & (candidates > 0.0))
        fill = tl.where(v > 0.0, fill + v, fill)
        gap = g - fill
    d_over = tl.min(tl.where(tail & (~used), tl.abs(x - gap[:, None]), float("inf")), axis=1)
    return tl.minimum(tl.abs(gap), d_over)


@triton.jit
def _certificate_kernel(
    x_ptr, index_ptr, n_rows, stride_row, n_keys, params_ptr, mitm_max,
    row_sum_ptr, p_max_ptr, d_found_ptr, d_lb_ptr, err_ptr, method_ptr, status_ptr,
    CHECK_SUM: tl.constexpr, EXACT_QUANTUM: tl.constexpr, GATHER: tl.constexpr, ROWS: tl.constexpr,
    BLOCK: tl.constexpr, K: tl.constexpr, TARGETS: tl.constexpr, ROUNDS: tl.constexpr,
    UNIT: tl.constexpr, SLACK: tl.constexpr, PER_KEY: tl.constexpr, OFFSET: tl.constexpr, QUANTA_LOG2: tl.constexpr,
    LOWEST_BIT_SUPPORT: tl.constexpr,
    DOMINANT: tl.constexpr, K_ATOM: tl.constexpr, PERFECT: tl.constexpr, PREFIX_BEST_FIT: tl.constexpr,
    NON_FINITE: tl.constexpr, NEGATIVE: tl.constexpr, EMPTY: tl.constexpr, BAD_SUM: tl.constexpr,
):  # fmt: skip
    """``ROWS`` rows per program, each row a [BLOCK] slice in registers; every per-row quantity is a [ROWS] vector.

    The program's rows are consecutive, or (``GATHER``) read from ``index_ptr``; outputs go to the same row index.
    """
    slots = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = slots < n_rows
    if GATHER:
        rows = tl.load(index_ptr + slots, mask=row_ok, other=0)
    else:
        rows = slots
    stop_d = tl.load(params_ptr)
    tolerance = tl.load(params_ptr + 1)
    smallest_exact_sum = tl.load(params_ptr + 2)
    inf = float("inf")

    offs = tl.arange(0, BLOCK)
    keys = offs[None, :]
    in_row = row_ok[:, None] & (keys < n_keys)
    raw = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_row + keys, mask=in_row, other=0.0)
    x = raw.to(tl.float64)
    positive = x > 0.0
    s = tl.sum(x, axis=1)
    n = tl.sum(positive.to(tl.int32), axis=1)
    p_max = tl.max(tl.where(positive, x, 0.0), axis=1)
    t = 0.5 * s

    non_finite = (s != s) | (tl.abs(s) == inf)
    negative = tl.max((x < 0.0).to(tl.int32), axis=1) > 0
    status = tl.where(non_finite, NON_FINITE, tl.where(negative, NEGATIVE, tl.where(n == 0, EMPTY, 0)))
    if CHECK_SUM:
        status = tl.where((status == 0) & (tl.abs(s - 1.0) > tolerance), BAD_SUM, status)

    # Rounding radius E (``_numba_kernels._error_radius``): 0 when ŝ ≤ 2^52·q makes every partial sum exact.
    log2_q = _log2_quantum(raw, x, s, positive, n, EXACT_QUANTUM, QUANTA_LOG2, LOWEST_BIT_SUPPORT)
    exact_sums = (s >= smallest_exact_sum) & (s <= _pow2(tl.minimum(tl.maximum(log2_q + QUANTA_LOG2, -1022), 1023)))
    err = tl.where(exact_sums, 0.0, (PER_KEY * n.to(tl.float64) + OFFSET) * UNIT * s * SLACK)
    q = tl.where(log2_q >= -1022, _pow2(tl.minimum(tl.maximum(log2_q, -1022), 1023)), 0.0)

    # Top-K atoms by K masked argmax rounds; subset_sums[T] = Σ_{k ∈ T} top_k in ascending k (as the CPU path).
    masks = tl.arange(0, 1 << K)[None, :]
    subset_sums = tl.zeros([ROWS, 1 << K], dtype=tl.float64)
    top_sum = tl.zeros([ROWS], dtype=tl.float64)
    is_top = x < 0.0
    available = tl.where(positive, x, -1.0)
    for k in tl.static_range(K):
        v, i = tl.max(available, axis=1, return_indices=True)
        v = tl.maximum(v, 0.0)
        hit = (keys == i[:, None]) & (available > 0.0)
        is_top = is_top | hit
        available = tl.where(hit, -1.0, available)
        subset_sums += tl.where(((masks >> k) & 1) == 1, v[:, None], 0.0)
        top_sum += v
    rest = s - top_sum

    # Top-K relaxation: d_lb = min_T dist(t, [p(T), p(T) + r]); the endpoints T and T ∪ tail are real subsets.
    lo = subset_sums - t[:, None]
    hi = t[:, None] - (subset_sums + rest[:, None])
    d_end = tl.minimum(tl.min(tl.abs(lo), axis=1), tl.min(tl.abs(hi), axis=1))
    d_lb = tl.min(tl.where(lo > 0.0, lo, tl.where(hi > 0.0, hi, 0.0)), axis=1)
    targets = t[:, None] - subset_sums
    score = tl.where((lo <= 0.0) & (hi <= 0.0), tl.abs(targets - 0.5 * rest[:, None]), inf)

    # Tail fill into the TARGETS targets g = t − p(T) ∈ [0, r] nearest r/2, best first.
    tail = positive & (~is_top)
    d_heuristic = d_end
    for _ in range(TARGETS):
        best_score, best_mask = tl.min(score, axis=1, return_indices=True)
        chosen = masks == best_mask[:, None]
        g = tl.sum(tl.where(chosen, targets, 0.0), axis=1)
        score = tl.where(chosen, inf, score)
        d_fill = _tail_fill(x, tail, keys, g, ROUNDS, BLOCK)
        d_heuristic = tl.minimum(d_heuristic, tl.where(best_score < inf, d_fill, inf))

    d_dominant = p_max - t
    dominant = d_dominant > err
    k_atom = (~dominant) & (d_lb > err)
    open_row = (~dominant) & (~k_atom)
    perfect = open_row & (err == 0.0) & (2.0 * d_heuristic <= q)
    reached = open_row & (~perfect) & (d_heuristic <= stop_d)
    method = tl.where(dominant, DOMINANT, tl.where(k_atom, K_ATOM, tl.where(perfect, PERFECT, 0)))
    method = tl.where(reached, PREFIX_BEST_FIT, method)
    method = tl.where((n > mitm_max) & (status == 0), method, 0)
    d_found = tl.where(dominant, d_dominant, tl.where(k_atom, d_lb, d_heuristic))
    d_lb = tl.where(dominant, d_dominant, tl.where(perfect, d_heuristic, d_lb))

    tl.store(row_sum_ptr + rows, s, mask=row_ok)
    tl.store(p_max_ptr + rows, p_max, mask=row_ok)
    tl.store(d_found_ptr + rows, d_found, mask=row_ok)
    tl.store(d_lb_ptr + rows, d_lb, mask=row_ok)
    tl.store(err_ptr + rows, err, mask=row_ok)
    tl.store(method_ptr + rows, method.to(tl.int8), mask=row_ok)
    tl.store(status_ptr + rows, status.to(tl.int8), mask=row_ok)


def certify_rows_triton(
    rows: torch.Tensor,
    stop_distance: float,
    mitm_max_support: int,
    check_sum: bool,
    tolerance: float,
    finish: RowCascade,
) -> dict[str, torch.Tensor]:
    """Per-row ŝ, p_max, d̂, d̂_lb, E, method and status for ``rows`` [row, key] (float32/float64), on its device.

    Args:
        stop_distance: a row is finished once its best subset has d ≤ this.
        mitm_max_support: rows with at most this many non-zeros are left to ``finish`` (exact there).
        check_sum, tolerance: flag rows with |ŝ − 1| > tolerance as BAD_SUM.
        finish: the CPU cascade, called once on the [m, key] CPU tensor of the rows left open; returns the same
            dictionary for them.

    Returns:
        The dictionary of ``_numba_kernels.certify_rows``' outputs (d̂_lb − E ≤ d* ≤ d̂ + E for every valid row).
    """
    rows = rows.contiguous()
    if rows.shape[-1] > MAX_KEYS:
        return {name: value.to(rows.device) for name, value in finish(rows.cpu()).items()}
    out = kernel_pass(rows, stop_distance, mitm_max_support, check_sum, tolerance)
    open_rows = torch.nonzero((out["status"] == 0) & (out["method"] == 0)).flatten()
    refine = open_rows[(rows[open_rows] > 0).sum(-1) > mitm_max_support]
    if refine.numel() > 0:
        _launch(rows, refine, out, stop_distance, mitm_max_support, check_sum, tolerance, REFINE_TARGETS, None)
        open_rows = open_rows[out["method"][open_rows] == 0]
    if open_rows.numel() > 0:
        open_rows = device_stages(rows, open_rows, out, stop_distance, mitm_max_support)
    if open_rows.numel() > 0:
        finished = finish(rows[open_rows].cpu())
        for name, value in finished.items():
            out[name][open_rows] = value.to(rows.device)
    return out


def device_stages(
    rows: torch.Tensor, index: torch.Tensor, out: dict[str, torch.Tensor], stop_distance: float, mitm_max_support: int
) -> torch.Tensor:
    """The stages after the kernel that vectorise over rows, in torch on the rows' device, for the valid rows
    ``index`` both launches left open; returns the rows still open (for ``finish``).

    * Rows of at most ``mitm_max_support`` keys: meet-in-the-middle (``MEET_IN_THE_MIDDLE``, exact).
    * Longer rows: the cardinality bound and, on rows of at most 48 keys, its three-group form (§3 step 4,
      ``CARDINALITY_BOUND``). These are mostly near-uniform rows with an odd count, which no fill settles.
    * Rows of more than ``EXACT_FIRST_MAX_SUPPORT`` keys still open: the LPT split and best single exchanges
      (``SWAP_DESCENT``, or ``PERFECT_PARTITION`` when 2d ≤ q with error-free sums). Shorter ones are left to the
      CPU cascade, which proves most of them optimal.

    The functions are the torch path's, with t = ŝ/2 from the kernel's own sum, so every distance is again t minus
    a sum of distinct stored values and the kernel's E applies unchanged; d̂_lb of a row the exchanges settle is
    the kernel's top-8 bound."""
    x = rows[index].to(torch.float64)
    n_keys = x.shape[-1]
    n = (x > 0).sum(-1)
    t = 0.5 * out["row_sum"][index]
    err = out["err"][index]
    short = n <= mitm_max_support
    if bool(short.any()):
        d = _meet_in_the_middle(x[short], t[short], min(mitm_max_support, n_keys))
        _settle(out, index[short], d, d, ThetaMethod.MEET_IN_THE_MIDDLE)
    long = torch.nonzero(~short).flatten()
    if long.numel() == 0:
        return index[:0]
    x, n, t, err, index = x[long], n[long], t[long], err[long], index[long]
    k_small = min(K_SMALL, n_keys)
    bound = _cardinality_bound(x, _subset_sums(x.topk(k_small, dim=-1).values), t, k_small)
    grouped = n <= GROUP_BOUND_MAX_SUPPORT
    if bool(grouped.any()):
        group_bound = _group_cardinality_bound(x[grouped], t[grouped], min(GROUP_BOUND_MAX_SUPPORT, n_keys))
        bound[grouped] = torch.maximum(bound[grouped], group_bound)
    proved = bound > err
    _settle(out, index[proved], bound[proved], bound[proved], ThetaMethod.CARDINALITY_BOUND)
    short_open = ~proved & (n <= EXACT_FIRST_MAX_SUPPORT)
    left = ~proved & ~short_open
    cpu = index[short_open]
    x, n, t, err, index = x[left], n[left], t[left], err[left], index[left]
    if index.numel() == 0:
        return cpu
    # The LPT split steps through the keys one column at a time (a few launches each): only as far as the
    # longest support among these rows, not the padded width.
    support = x.topk(int(n.max()), dim=-1).values
    d = torch.minimum(out["d_found"][index], _greedy_with_exchanges(support, t, stop_distance))
    q = _quantum(x, x > 0, out["row_sum"][index], n, exact_quantum=rows.dtype == torch.float64)
    perfect = (err == 0.0) & (2.0 * d <= q)
    _settle(out, index[perfect], d[perfect], d[perfect], ThetaMethod.PERFECT_PARTITION)
    reached = ~perfect & (d <= stop_distance)
    _settle(out, index[reached], d[reached], out["d_lb"][index[reached]], ThetaMethod.SWAP_DESCENT)
    return torch.cat([cpu, index[~perfect & ~reached]])


def _settle(out: dict[str, torch.Tensor], index: torch.Tensor, d_found: torch.Tensor, d_lb: torch.Tensor,
            method: ThetaMethod) -> None:  # fmt: skip
    out["d_found"][index] = d_found
    out["d_lb"][index] = d_lb
    out["method"][index] = int(method)


def kernel_pass(
    rows: torch.Tensor,
    stop_distance: float,
    mitm_max_support: int,
    check_sum: bool,
    tolerance: float,
    launch: tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """The first, one-target pass over contiguous ``rows`` [row, key ≤ MAX_KEYS]; open rows keep method 0.

    ``launch`` = (rows per program, warps) overrides ``launch_shape`` (for tuning on a GPU).
    """
    n_rows = rows.shape[0]
    out = {name: torch.empty(n_rows, dtype=torch.float64, device=rows.device)
           for name in ("row_sum", "p_max", "d_found", "d_lb", "err")}  # fmt: skip
    out["method"] = torch.empty(n_rows, dtype=torch.int8, device=rows.device)
    out["status"] = torch.empty(n_rows, dtype=torch.int8, device=rows.device)
    if n_rows > 0:
        _launch(rows, None, out, stop_distance, mitm_max_support, check_sum, tolerance, 1, launch)
    return out


def _launch(
    rows: torch.Tensor,
    index: torch.Tensor | None,
    out: dict[str, torch.Tensor],
    stop_distance: float,
    mitm_max_support: int,
    check_sum: bool,
    tolerance: float,
    n_targets: int,
    launch: tuple[int, int] | None,
) -> None:
    """Run the kernel with ``n_targets`` fill targets on all rows, or on the rows listed in ``index``."""
    n_keys = rows.shape[1]
    device = rows.device
    n_rows = rows.shape[0] if index is None else index.numel()
    params = torch.tensor([stop_distance, tolerance, SMALLEST_EXACT_SUM], dtype=torch.float64, device=device)
    block = max(16, triton.next_power_of_2(n_keys))
    rows_per_program, num_warps = launch or launch_shape(block, interpreted=device.type == "cpu")
    _certificate_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        rows, rows if index is None else index, n_rows, rows.stride(0), n_keys, params, mitm_max_support,
        out["row_sum"], out["p_max"], out["d_found"], out["d_lb"], out["err"], out["method"], out["status"],
        CHECK_SUM=check_sum, EXACT_QUANTUM=rows.dtype == torch.float64, GATHER=index is not None,
        ROWS=rows_per_program, BLOCK=block, K=K_SMALL, TARGETS=n_targets, ROUNDS=BEST_FIT_ROUNDS,
        UNIT=UNIT_ROUNDOFF, SLACK=ERROR_RADIUS_SLACK, PER_KEY=ERROR_RADIUS_PER_KEY, OFFSET=ERROR_RADIUS_OFFSET,
        QUANTA_LOG2=EXACT_SUM_QUANTA_LOG2, LOWEST_BIT_SUPPORT=LOWEST_BIT_MAX_SUPPORT,
        DOMINANT=int(ThetaMethod.DOMINANT_ATOM), K_ATOM=int(ThetaMethod.K_ATOM_RELAXATION),
        PERFECT=int(ThetaMethod.PERFECT_PARTITION), PREFIX_BEST_FIT=int(ThetaMethod.PREFIX_BEST_FIT),
        NON_FINITE=int(RowStatus.NON_FINITE), NEGATIVE=int(RowStatus.NEGATIVE), EMPTY=int(RowStatus.EMPTY),
        BAD_SUM=int(RowStatus.BAD_SUM), num_warps=num_warps,
    )  # fmt: skip


def runs_on(device: torch.device) -> bool:
    """CUDA devices always; CPU tensors only when the kernel was built by Triton's interpreter (TRITON_INTERPRET=1
    set before triton was imported)."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and not isinstance(_certificate_kernel, triton.runtime.jit.JITFunction)


def launch_shape(block: int, *, interpreted: bool) -> tuple[int, int]:
    """(rows per program, warps per program) for rows padded to ``block`` keys.

    On the GPU about 2048 keys per program (one warp per 1024-key row holds 32 values per lane, §7), at most 16
    rows; the interpreter runs programs one after another, so it takes many rows per program.
    """
    if interpreted:
        return max(1, min(64, 16384 // block)), 1
    rows_per_program = max(1, min(16, 2048 // block))
    return rows_per_program, max(1, min(16, rows_per_program * block // 512))
