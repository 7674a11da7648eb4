"""The residue bound of the θ cascade (docs/theta-algorithms.md §3 step 4): subset sums modulo a power of two.

With error-free sums a row is a list of integers a_i = p_i/q (q the row quantum) with total V, and every subset
sum is an integer A. A subset at distance d = |A − V/2|·q from t has A = (V ± δ)/2 with δ = 2d/q, δ ≡ V (mod 2).
Whatever A is, its residue A mod M lies in the set R of residues that subset sums reach, which a bitset of M bits
holds after one rotation and union per value (R ← R ∪ (R + a_i mod M)). The least δ for which (V − δ)/2 or
(V + δ)/2 has its residue in R is then a lower bound: d* ≥ δ·q/2. Parity is the case M = 2 (V odd: d* ≥ q/2,
the perfect-partition rule); a larger M sees more of the row's low bits.

Float values give the bound its strength. A float32 value in [2^e, 2^(e+1)) is a multiple of 2^(e − 23), so the
low bits of a row's sums come from its few smallest values, and their subset sums alone decide which residues
the row reaches. Where the bound exceeds q/2 no split is perfect, and a search that finds a subset at the bound
has proved the optimum (``RESIDUE_BOUND``).
"""

from __future__ import annotations

import numpy as np

from attnsens._numba_cache import cached_njit

RESIDUE_MODULUS_BITS = 6
"""M = 2^6: the residues fit one 64-bit word, so each value costs a rotation and an OR (0.44 µs a row of 48 keys,
the call from Python included). On the rows of 25–48 keys that the short-row proofs left open (a sample of
100–150 of each real tensor, each row's optimum from meet-in-the-middle), moduli up to 2^22 proved the optimum
of 21 SmolLM2 rows, 18 causal synthetic rows and 3 of the tiny GPT's; 2^6 was enough for all SmolLM2's, 15 of the
18 and 2 of the 3."""
RESIDUE_MODULUS = 1 << RESIDUE_MODULUS_BITS
_MASK = np.uint64(RESIDUE_MODULUS - 1)
_ONE = np.uint64(1)
_WORD = np.uint64(1 << RESIDUE_MODULUS_BITS)


@cached_njit()
def reached_residues(vals, q):
    """(R, V): the bitset of the residues modulo 64 that subset sums of ``vals`` reach (bit r set when some
    subset's sum, in units of q, is ≡ r), and the total V in units of q. Every value must be a multiple of q and
    their total at most 2^52·q (error-free sums), so that each a_i = v_i/q and V are exact integers."""
    reach = _ONE  # the empty subset: residue 0
    total = np.int64(0)
    for v in vals:
        a = np.int64(v / q)
        total += a
        reach = _with_value(reach, a)
    return reach, total


@cached_njit()
def _with_value(reach, a):
    """The residues ``reach`` holds, and each of them plus the integer a ≥ 0 (mod 64): one rotation and an OR."""
    shift = np.uint64(a) & _MASK
    if shift != 0:
        reach |= (reach << shift) | (reach >> (_WORD - shift))
    return reach


@cached_njit()
def integer_residues(values):
    """The bitset of the residues modulo 64 that subset sums of the non-negative int64 ``values`` reach."""
    reach = _ONE
    for a in values:
        reach = _with_value(reach, a)
    return reach


@cached_njit()
def reaches(reach, target):
    """Whether the residue of the integer ``target`` ≥ 0 modulo 64 is in the bitset ``reach``."""
    return (reach >> (np.uint64(target) & _MASK)) & _ONE != 0


@cached_njit()
def residue_count(reach):
    """How many residues the bitset ``reach`` holds."""
    count = 0
    while reach:
        reach &= reach - _ONE
        count += 1
    return count


@cached_njit()
def residue_bound(vals, q):
    """(d_lb, reached): a lower bound on d* = min_S |p(S) − s/2| from the residues of the subset sums modulo 64,
    and how many of the 64 residues they reach. d_lb = δ·q/2 for the least δ ≡ V (mod 2) such that (V − δ)/2 or
    (V + δ)/2 has a reached residue (``reached_residues``; same conditions on ``vals``). Both candidates are
    tested, though a subset's complement makes one reached when the other is.

    The loop ends within 64 steps: (V − δ)/2 walks down through consecutive integers, and residue 0 (the empty
    subset) is always reached; at worst at δ = V, A = 0."""
    reach, total = reached_residues(vals, q)
    delta = total & 1
    while delta < total:
        if reaches(reach, (total - delta) >> 1) or reaches(reach, (total + delta) >> 1):
            break
        delta += 2
    return 0.5 * np.float64(delta) * q, residue_count(reach)
