"""The soundness-critical constants of the θ cascade, one source for the numba, torch and Triton backends.

Kept free of torch, numba and triton imports: the numba kernels read these numbers as compile-time constants,
and the Triton kernel receives them as arguments. The stage codes are ``methods.ThetaMethod``; u, the unit
roundoff of float64, is ``attnsens._float64.UNIT_ROUNDOFF``.
"""

from __future__ import annotations

ERROR_RADIUS_PER_KEY = 2.0
ERROR_RADIUS_OFFSET = 16.0
ERROR_RADIUS_SLACK = 1.0 + 2.0**-10
"""E = (ERROR_RADIUS_PER_KEY·n + ERROR_RADIUS_OFFSET)·u·ŝ·ERROR_RADIUS_SLACK bounds the absolute error of every
computed distance of a row with n non-zeros (at most n + 16 float64 additions of operands ≤ s: (1.5n + 13)·u·s,
Higham Thm 4.2; the slack covers the rounding of E itself). See ``_numba_kernels``."""

EXACT_SUM_QUANTA_LOG2 = 52
SMALLEST_EXACT_SUM = 2.0**-1000
"""Sums are error-free (E = 0) when every value is a multiple of the power-of-two quantum q and
SMALLEST_EXACT_SUM ≤ ŝ ≤ 2^EXACT_SUM_QUANTA_LOG2·q: every partial sum and difference is then a float64."""

K_SMALL = 8
"""Atoms of the top-K relaxation that every row gets (its 2^8 subset sums), and of the cardinality bound."""
K_LARGE = 14
"""Atoms of the second, larger relaxation run on rows the heuristics leave open."""
N_TARGETS = 16
"""First-fit targets of the second first-fit pass (the 16 top-8 subsets whose target is nearest r/2)."""
SWAP_ROUNDS = 8
"""Rounds of best single exchanges after the greedy split."""
MITM_CHEAP_SUPPORT = 24
"""Rows with at most this many non-zeros go straight to meet-in-the-middle (≤ 0.2 ms a row)."""
ENUMERATED_AFTER_PROOFS = 26
"""Rows of up to this many keys that the proofs of ``prove_short_row`` leave open are enumerated at once, whatever
``mitm_max`` (about 0.2 ms a row), instead of going on to settle at the precision asked without a proof. Rows of
25–28 keys exact, one thread: SmolLM2 at 256 tokens 62 → 79 %, those rows' time 19 → 68 ms (the whole tensor
about 0.42 s); the tiny GPT at checkpoints 0–64 66 → 86 %, 100 → 155 ms. Enumerating up to 28 keys makes all of
them exact but took SmolLM2's 157 ms. The GPU kernel and the torch path enumerate only up to ``mitm_max`` (every
row of that support, on the device); of the GPU kernel's rows, those it leaves open come here."""
LOWEST_BIT_MAX_SUPPORT = 128
"""float32 rows of at most this many non-zeros (with error-free sums) take as quantum q the lowest set mantissa bit
over the row, a second pass, rather than the ulp of the smallest value, which the scan reads for free. Both divide
every value; the lowest bit is a multiple of the ulp, so a split with 2d ≤ q proves more rows optimal: those whose
smallest values all have even mantissas (common when they sit alone in the lowest binades). On SmolLM2's rows of
25–48 keys 70.4 → 71.3 % exact, on the tiny GPT's 78.4 → 79.3 %; on longer rows it proved nothing more."""
