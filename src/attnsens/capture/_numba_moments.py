"""One vectorised pass over each float32 attention row: max, argmax, Σp, Σp², −Σ p log p, nonzero count; and the
same pass over a softmax row and its logits, which takes the entropy from the logits (``moments_of_row_logits``).

Compiled on first use (numba is imported by the caller only when a CPU tensor needs it).

The sums are float64 and taken in whatever order vectorises (``fastmath`` reassociation only: no value is
approximated, and a float64 sum of n float32 values in [0, 1] that add up to about 1 is off by at most about
n·2^-53 in any order; a sequential sum, as before, differs from it in the last few bits). The logarithm is
fdlibm's ``__ieee754_log`` (Sun Microsystems, 1993; the algorithm behind many C libraries' ``log``: reduction to
[√2/2, √2), log(1 + f) = 2·atanh(f / (2 + f)) by a polynomial, the exponent's k·ln 2 in two parts; error below
1 ulp) written out on the float32 bits of the value, so that the pass vectorises where a call into the C
library's ``log`` does not: over every one of the 2.13·10^9 positive normal float32 values it agrees with the C
library's ``log`` to 1 ulp, 99.37 % of them bit for bit (``tests/slow/test_moments_log.py`` checks them all; where
the compiler fuses products and sums, on processors with FMA, a result may differ in its last bit from that of a
processor without).
Subnormal float32 values (below 2^-126: in softmax rows only the remains of underflow) take ``math.log`` in a
second pass over the rows that have any. p_max, argmax and the count are exact.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from attnsens._numba_cache import cached_njit
from attnsens.theta.kernels import support_end

LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
"""ln 2 in two parts (fdlibm): k·LN2_HI is exact for |k| < 2^11."""
LG1, LG2, LG3 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01
LG4, LG5 = 2.222219843214978396e-01, 1.818357216161805012e-01
LG6, LG7 = 1.531383769920937332e-01, 1.479819860511658591e-01
"""fdlibm's coefficients of R ≈ 2s²/3 + 2s⁴/5 + … + 2s¹⁴/15, with log(1 + f) = 2s + s·R (s = f / (2 + f)):
|error| ≤ 2^-58.45 on the reduced range."""
SMALLEST_NORMAL_BITS = 0x00800000
"""Bits of 2^-126, the smallest normal float32: positive values below it are subnormal."""
MANTISSA_ULP = 2.0**-23
NO_POSITIVE = np.int32(np.iinfo(np.int32).max)
"""The largest int32: the ``no_positive`` that the θ scan (``support_end``, ``scan_row``) takes for float32 rows."""


@cached_njit(error_model="numpy", fastmath={"contract"})
def _log(bits):  # pragma: no cover - compiled
    """log p in float64 of the positive normal float32 p with the int32 ``bits`` (anything finite for other bits):
    fdlibm's ``__ieee754_log`` reduction and polynomial with one of its final formulas for every value, written
    branch-free so that the row pass vectorises.

    p = m·2^k; m ≥ √2 (fdlibm's test on hx, the 20 leading mantissa bits of p as a float64: those of the float32
    mantissa) is halved (k + 1), f = m − 1 (exact), s = f / (2 + f), R ≈ log(1 + f)/s − 2 by fdlibm's
    polynomial in s², and log p = k·ln2_hi − ((½f² − (s·(½f² + R) + k·ln2_lo)) − f).

    Where fdlibm picks that formula: 0x6147a < hx < 0x6b851. Elsewhere it uses
    k·ln2_hi − ((s·(f − R) − k·ln2_lo) − f) and, for |f| < 2^-20, a third. On normal float32 values the first
    formula is as good everywhere (within 1 ulp of the C library's ``log``; 0.63 % of the results differ from it,
    0.62 % with all three formulas: ``tests/slow/test_moments_log.py`` checks every value), so the others are left
    out. The integer steps stay in int32 (half the vector width of int64, and one int32 → float64 conversion
    instruction instead of a widening and an int64 one) and the compiler may fuse a product and a sum into one FMA
    (``contract``, no other fastmath licence: the order of evaluation is the written one). The three changes take
    ``row_moments`` from 1.70 to 1.35 ns a value on one core (4096 softmax rows of 2048 keys; AMD EPYC with
    AVX-512), where the logarithm's arithmetic bounds it."""
    mantissa = np.int32(bits & np.int32(0x7FFFFF))
    halve = np.int32(mantissa >> np.int32(3)) >= np.int32(0x6A09C)  # fdlibm: (hx + 0x95f64) & 0x100000
    k = np.float64(np.int32(np.int32(bits >> np.int32(23)) - np.int32(126 if halve else 127)))
    m = 1.0 + np.float64(mantissa) * MANTISSA_ULP
    f = (0.5 * m if halve else m) - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (LG2 + w * (LG4 + w * LG6))
    t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
    r = t2 + t1
    half_f2 = 0.5 * f * f
    return k * LN2_HI - ((half_f2 - (s * (half_f2 + r) + k * LN2_LO)) - f)


@cached_njit(error_model="numpy", fastmath={"reassoc", "nsz"})
def _row_pass(row, bits):  # pragma: no cover - compiled
    """(Σp, Σp², −Σ p log p over normal p, positive count, subnormal count, largest bits) of one row, one pass.

    On non-negative floats integer order is value order, so the largest value has the largest bits (−0.0, whose
    bits are negative, and negative values never win against the start at +0.0)."""
    total = 0.0
    squares = 0.0
    entropy = 0.0
    count = 0
    subnormal = 0
    best = 0
    for j in range(row.size):
        b = bits[j]
        positive = b > 0
        x = np.float64(row[j]) if positive else 0.0
        term = x * _log(b)
        total += x
        squares += x * x
        entropy -= term if b >= SMALLEST_NORMAL_BITS else 0.0
        count += positive
        subnormal += positive & (b < SMALLEST_NORMAL_BITS)
        best = max(best, b)
    return total, squares, entropy, count, subnormal, best


@cached_njit()
def _subnormal_entropy(row, bits):  # pragma: no cover - compiled
    """−Σ p log p over the row's positive subnormal values."""
    h = 0.0
    for j in range(row.size):
        if 0 < bits[j] < SMALLEST_NORMAL_BITS:
            x = np.float64(row[j])
            h -= x * math.log(x)
    return h


@cached_njit()
def _first_index(bits, value):  # pragma: no cover - compiled
    for j in range(bits.size):
        if bits[j] == value:
            return j
    return 0


@cached_njit()
def moments_of_row(row, bits):  # pragma: no cover - compiled
    """(p_max, its first key, Σp, Σp², −Σ p log p, positive count) of one float32 row with int32 ``bits``.

    The logarithm's pass reads the row up to its last entry that is not ±0.0 (``support_end``, whole blocks of
    zeros at a time): a causal row's zero tail adds nothing to any sum, and costs a comparison a key instead of a
    logarithm."""
    end = support_end(bits, NO_POSITIVE)
    s, s2, h, count, subnormal, best = _row_pass(row[:end], bits[:end])
    if subnormal:
        h += _subnormal_entropy(row[:end], bits[:end])
    index = _first_index(bits, best)
    return row[index], index, s, s2, h, count


@cached_njit(error_model="numpy", fastmath={"reassoc", "nsz"})
def _row_pass_logits(row, bits, logits, center):  # pragma: no cover - compiled
    """(Σp, Σp², Σ p·(s − ``center``) over positive p, positive count, largest bits) of one row and its logits s,
    one pass.

    A key with p = 0 (masked, s = −∞, or underflowed) adds nothing: its logit is not read into the sums."""
    total = 0.0
    squares = 0.0
    cross = 0.0
    count = 0
    best = 0
    for j in range(row.size):
        b = bits[j]
        positive = b > 0
        x = np.float64(row[j]) if positive else 0.0
        s = np.float64(logits[j]) - center if positive else 0.0
        total += x
        squares += x * x
        cross += x * s
        count += positive
        best = max(best, b)
    return total, squares, cross, count, best


@cached_njit()
def moments_of_row_logits(row, bits, logits):  # pragma: no cover - compiled
    """``moments_of_row`` of a softmax row whose logits ``logits`` (float32, the values the softmax read) are at
    hand: the entropy without a logarithm a key.

    With p_i = exp(s_i − log Z), −Σ p_i log p_i = log Z · Σp − Σ p_i s_i, and log Z = s_a − log p_a at the largest
    entry a: one logarithm a row. Each stored p_i carries the softmax's rounding (a few float32 ulps), so this and
    −Σ p log p of the stored values are two estimates of the row's entropy that differ by a few 2^-24 · Σp
    (docs/math.md §2.4). Rounding can leave a row that is one key in all but the last bits a few 10^-14 below 0;
    the result is clamped at 0, the entropy's true lower bound. p_max, argmax, Σp, Σp² and the count are those of
    ``moments_of_row`` bit for bit.

    The logits are taken relative to that of the row's first positive key, c: every key with p_i > 0 (subnormal
    float32 values included) has s_i within 104 of log Z, so the sums hold terms of at most about 104 whatever the
    logits' scale (with logits near 10^12, log Z · Σp and Σ p s would each be about 10^12, and their float64
    rounding, about 10^-4, would swamp H's digits)."""
    end = support_end(bits, NO_POSITIVE)
    first = 0
    while first < end and bits[first] <= 0:
        first += 1
    center = np.float64(logits[first]) if first < end else 0.0
    s, s2, cross, count, best = _row_pass_logits(row[:end], bits[:end], logits[:end], center)
    index = _first_index(bits, best)
    entropy = 0.0
    if count:
        log_z = np.float64(logits[index]) - center - math.log(np.float64(row[index]))  # log Z − c
        entropy = max(0.0, log_z * s - cross)
    return row[index], index, s, s2, entropy, count


@cached_njit(parallel=True)
def row_moments(rows, p_max, argmax, total, squares, entropy, nonzero):  # pragma: no cover - compiled
    """Per row of ``rows`` [row, key] (float32, C-contiguous): p_max, its first key, Σp, Σp², −Σ p log p and
    the number of positive entries (zeros are masked keys and add nothing)."""
    bits = rows.view(np.int32)
    for r in numba.prange(rows.shape[0]):
        p_max[r], argmax[r], total[r], squares[r], entropy[r], nonzero[r] = moments_of_row(rows[r], bits[r])
