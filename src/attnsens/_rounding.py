"""Directed rounding for certified float64 numbers: the one rounding discipline of θ and geometry.

A certified number of attnsens bounds a real-arithmetic quantity of the stored inputs (weights, activations and
probabilities as the float values they are). Hardware rounds to nearest, so a certified upper bound is built from
operations rounded up, a lower bound from operations rounded down, and every step that is not a single IEEE
operation carries a proved error radius. The argument, in three rules:

1. **One operation.** For a correctly rounded IEEE operation (``+ − × ÷ √``, float64 on CPU and CUDA), the real
   result r lies between the two floats adjacent to fl(r), so ``nextafter(fl(r), +∞) ≥ r`` and
   ``nextafter(fl(r), −∞) ≤ r``, overflow and underflow included (an overflow to ±∞ stays on the safe side).
   ``add_up``, ``mul_up``, ``div_up``, ``sqrt_up`` and their ``_down`` twins apply one operation and one step.
2. **Sums.** Any summation order (pairwise, blocked, FMA) of n terms satisfies |fl(Σ x_i) − Σ x_i| ≤
   γ_{n−1} Σ |x_i| with γ_k = k·u/(1 − k·u), u = 2^-53 (Higham, *Accuracy and Stability of Numerical Algorithms*,
   2nd ed., Lemma 3.1 and §4.2; matrix products entrywise |fl(AB) − AB| ≤ γ_k |A||B|, eq. 3.13, inner size k).
   For nonnegative terms Σ x_i ∈ [fl(Σ)·(1 − 2γ), fl(Σ)·(1 + 2γ)] (γ ≤ 2^-20), and ``sum_upper_bound`` /
   ``sum_lower_bound`` evaluate that product with rule 1. Underflowed terms are rounded in the safe direction
   first (``square_up``/``square_down``), so gradual underflow costs nothing extra.
3. **Spectral norms.** ``spectral_norm_upper_bound`` needs no accuracy claim about any eigensolver. With the
   float Gram matrix Ĝ = fl(W Wᵀ) (smaller side, inner size k), ‖W‖₂² = λ_max(W Wᵀ) ≤ λ_max(Ĝ) + γ_k ‖W‖_F²
   (‖Ĝ − W Wᵀ‖₂ ≤ γ_k ‖|W||W|ᵀ‖_F ≤ γ_k ‖W‖_F²), and λ_max(Ĝ) is certified by a shifted Cholesky factorization:
   if Cholesky completes on fl(t I − Ĝ), then λ_max(Ĝ) ≤ t + u (t + max|Ĝ_ii|) + γ_{2m+2} ‖L̂‖_F² (Higham,
   Thm 10.3, ``_cholesky_top_eigenvalue_bound``), with t just above the computed top eigenvalue. Where the
   factorization fails the bound falls back to any computed eigenpairs (V, Λ) and the exact residual
   E = Ĝ − V Λ Vᵀ: Ĝ ⪯ V Λ₊ Vᵀ + ‖E‖₂ I, hence λ_max(Ĝ) ≤ λ̂₊·(1 + ‖VᵀV − I‖_F) + ‖E‖_F, each Frobenius norm
   enlarged by its own rule-2 radius. Either way the bound is the float64 norm to about 10 digits or better.

LayerNorm σ and RMSNorm r bounded below (``layernorm_scale_lower_bound``, ``rmsnorm_scale_lower_bound``) follow
the same rules; the LayerNorm centring is exact in real arithmetic for any centre c because
var(x) = mean((x − c)²) − (mean(x) − c)², so a float mean only costs the (tiny, bounded) second term.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from typing import TypeVar, cast

import torch
from torch import Tensor

from attnsens._float64 import UNIT_ROUNDOFF  # u: half the distance from 1 to the next float64

T = TypeVar("T")


@functools.lru_cache(maxsize=64)
def _infinity(sign: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.tensor(sign * math.inf, dtype=dtype, device=device)


def round_up(x: Tensor) -> Tensor:
    """The next float above x (≥ the real result of the operation that produced x; rule 1)."""
    return torch.nextafter(x, _infinity(1.0, x.dtype, x.device))


def round_down(x: Tensor) -> Tensor:
    """The next float below x (≤ the real result of the operation that produced x; rule 1)."""
    return torch.nextafter(x, _infinity(-1.0, x.dtype, x.device))


@functools.lru_cache(maxsize=1024)
def gamma(k: int) -> float:
    """γ_k = k·u/(1 − k·u), rounded up (Higham's constant for k roundings); requires k·u < 2^-20."""
    k = max(int(k), 1)
    ku = k * UNIT_ROUNDOFF
    if ku >= 2.0**-20:
        raise ValueError(f"{k} accumulated roundings are beyond the certified range (k·u must stay below 2^-20)")
    return math.nextafter(math.nextafter(ku / (1.0 - ku), math.inf) * (1 + 2.0**-50), math.inf)


def product_error_factor(terms: int) -> float:
    """c with |fl(Σ_j a_j b_j) − Σ_j a_j b_j| ≤ c·m̂ for a sum of ``terms`` products (a bias counts as one), where
    m̂ = fl(Σ_j |a_j||b_j|) is the magnitude as float64 computes it: γ_terms (rule 2), enlarged by 1 + 2γ_terms
    because m̂ is itself within γ_terms of the real magnitude."""
    g = gamma(terms)
    return g * (1 + 2 * g)


def float_up(x: float) -> float:
    """The float above the Python float x (x itself when infinite or NaN): ≥ the real result of the one
    operation that gave x (rule 1)."""
    return x if not math.isfinite(x) else math.nextafter(x, math.inf)


def float_down(x: float) -> float:
    """The float below the Python float x (x itself when infinite or NaN)."""
    return x if not math.isfinite(x) else math.nextafter(x, -math.inf)


def scale_lower_bound_on_ball(scale: Tensor, radius: Tensor, d: int, eps: float) -> Tensor:
    """≤ the norm scale (‖Pz‖²/d + ε)^{1/2} at every z within ``radius`` of a point where it is ≥ ``scale``
    (P the centring for LayerNorm, the identity for RMSNorm): it is (1/√d)-Lipschitz in ℓ2 and ≥ √ε everywhere."""
    shifted = sub_down(scale, div_up(radius.to(torch.float64), math.nextafter(math.sqrt(d), 0)))
    return torch.maximum(shifted, sqrt_down(torch.tensor(float(eps), dtype=torch.float64)))


def add_up(a: Tensor, b: Tensor | float) -> Tensor:
    """≥ a + b."""
    return round_up(a + b)


def add_down(a: Tensor, b: Tensor | float) -> Tensor:
    """≤ a + b."""
    return round_down(a + b)


def sub_down(a: Tensor, b: Tensor | float) -> Tensor:
    """≤ a − b."""
    return round_down(a - b)


def sub_up(a: Tensor, b: Tensor | float) -> Tensor:
    """≥ a − b."""
    return round_up(a - b)


def mul_up(a: Tensor, b: Tensor | float) -> Tensor:
    """≥ a·b."""
    return round_up(a * b)


def mul_down(a: Tensor, b: Tensor | float) -> Tensor:
    """≤ a·b."""
    return round_down(a * b)


def div_up(a: Tensor, b: Tensor | float) -> Tensor:
    """≥ a/b."""
    return round_up(a / b)


def div_down(a: Tensor, b: Tensor | float) -> Tensor:
    """≤ a/b."""
    return round_down(a / b)


def sqrt_up(x: Tensor) -> Tensor:
    """≥ √x for x ≥ 0."""
    return round_up(torch.sqrt(x))


def sqrt_down(x: Tensor) -> Tensor:
    """≤ √x for x ≥ 0 (0 stays 0; a lower bound rounded just below 0 counts as 0)."""
    return round_down(torch.sqrt(x.clamp_min(0.0))).clamp_min(0.0)


def square_up(x: Tensor) -> Tensor:
    """≥ x² (≥ 0)."""
    return round_up(x * x)


def square_down(x: Tensor) -> Tensor:
    """≤ x², clamped at 0."""
    return round_down(x * x).clamp_min(0.0)


def sum_upper_bound(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """≥ Σ x over ``dim`` for nonnegative x (rule 2)."""
    n = math.prod(x.shape[d] for d in ((dim,) if isinstance(dim, int) else dim))
    return mul_up(x.sum(dim=dim), math.nextafter(1.0 + 2.0 * gamma(n), math.inf))


def sum_lower_bound(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """≤ Σ x over ``dim`` for nonnegative x (rule 2)."""
    n = math.prod(x.shape[d] for d in ((dim,) if isinstance(dim, int) else dim))
    return mul_down(x.sum(dim=dim), math.nextafter(1.0 - 2.0 * gamma(n), -math.inf))


def norm2_upper_bound(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """≥ ‖x‖₂ over ``dim`` (float64)."""
    return sqrt_up(sum_upper_bound(square_up(x.to(torch.float64).abs()), dim))


def norm2_lower_bound(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """≤ ‖x‖₂ over ``dim`` (float64)."""
    return sqrt_down(sum_lower_bound(square_down(x.to(torch.float64).abs()), dim))


def mean_offset_upper_bound(centred: Tensor) -> Tensor:
    """≥ |mean(x) − c| per token, from the float y = fl(x − c) ``[..., d]`` of any float centre c: the real
    x_i − c is within one rounding of y_i, so |Σ (x_i − c)|/d ≤ (|fl Σ y| + (γ_d + 2u) Σ |y|)/d (rule 2)."""
    d = centred.shape[-1]
    spread = sum_upper_bound(round_up(centred.abs()))
    return div_up(add_up(centred.sum(dim=-1).abs(), mul_up(spread, gamma(d) + 2 * UNIT_ROUNDOFF)), float(d))


def frobenius_norm_upper_bound(M: Tensor) -> Tensor:
    """≥ ‖M‖_F over the last two axes (float64)."""
    return norm2_upper_bound(M, (-2, -1))


def spectral_norm_upper_bound(W: Tensor, *, remember: bool = True) -> Tensor:
    """≥ ‖W‖₂ = σ_max(W) in real arithmetic, batched over leading axes (rule 3 of the module docstring).

    Args:
        W: ``[..., rows, cols]``, any floating dtype (the stored values are the real matrix).
        remember: keep the result for this tensor (``cached_on``; off for per-row matrices used once).

    Returns:
        ``[...]`` float64 certified upper bound; within a few hundred ulps of the float64 norm in practice.

    >>> float(spectral_norm_upper_bound(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))) >= 4.0
    True
    """
    if not remember:
        return _spectral_norm_upper_bound_scaled(W)
    return cached_on((W,), "spectral_norm_upper_bound", lambda: _spectral_norm_upper_bound_scaled(W))


def product_spectral_norm_upper_bound(A: Tensor, B: Tensor) -> Tensor:
    """≥ ‖A·B‖₂ of the real product, batched over leading axes: the computed float64 product's certified norm plus
    a bound on its rounding error, |A·B − fl(A·B)| ≤ γ_k·|A|·|B| elementwise for inner dimension k (Higham Thm 3.5,
    any summation order), whose spectral norm is at most its Frobenius norm.

    A computed product can lose everything to cancellation (rows like (10^8, 1, −10^8)·(10^8, 1, 10^8) multiply to
    0 in float64 and to 1 in reals), so the norm of fl(A·B) alone is no upper bound.
    """
    A64, B64 = A.to(torch.float64), B.to(torch.float64)
    k = A64.shape[-1]
    computed = spectral_norm_upper_bound(A64 @ B64)
    magnitude = frobenius_norm_upper_bound(A64.abs() @ B64.abs())  # itself computed: inflated by 1 + γ_k below
    error = mul_up(magnitude, math.nextafter(gamma(k) * (1.0 + 2.0 * gamma(k)), math.inf))
    return add_up(computed, error)


def cached_on(tensors: tuple[Tensor, ...], tag: str, compute: Callable[[], T]) -> T:
    """compute(), remembered for these tensors: a function of weight matrices that one model's bounds need several
    times. The key is each tensor (or the tensor a view reads) with the view's layout; a hit requires every such
    tensor to be the same live object (weak reference) at the same in-place version, so a changed or new tensor is
    always recomputed."""
    bases = [t if t._base is None else t._base for t in tensors]
    key = (tag, *((id(b), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device)
                  for b, t in zip(bases, tensors, strict=True)))  # fmt: skip
    hit = _CACHE.get(key)
    if hit is not None and all(r() is b and v == b._version for (r, v), b in zip(hit[0], bases, strict=True)):
        return cast(T, hit[1])  # the key's tag names the function, so the entry holds a T
    value = compute()
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = ([(weakref.ref(b), b._version) for b in bases], value)
    return value


_CACHE: dict[tuple, tuple[list, object]] = {}
_CACHE_SIZE = 4096


def _spectral_norm_upper_bound_scaled(W: Tensor) -> Tensor:
    W = W.to(torch.float64)
    # A power-of-two scale to max |W_ij| ≈ 1 keeps every square away from underflow and overflow; it is exact unless
    # it flushes tiny entries, which the round trip detects (then the matrix is used as it is).
    peak = W.abs().amax(dim=(-2, -1), keepdim=True)
    _, exponent = torch.frexp(torch.where(peak > 0, peak, torch.ones_like(peak)))
    scale = torch.ldexp(torch.ones_like(peak), -exponent)
    scaled = W * scale
    if not bool((scaled / scale == W).all()):
        scale, scaled = torch.ones_like(peak), W
    return mul_up(_spectral_norm_upper_bound_unscaled(scaled), 1.0 / scale[..., 0, 0])


def _spectral_norm_upper_bound_unscaled(W: Tensor) -> Tensor:
    """Rule 3: a shifted Cholesky certificate of λ_max(Ĝ), with the eigenvector residual bound as a fallback."""
    k = max(W.shape[-1], W.shape[-2])
    gram = W @ W.transpose(-1, -2) if W.shape[-2] <= W.shape[-1] else W.transpose(-1, -2) @ W
    m = gram.shape[-1]
    if m == 0 or k == 0:
        return torch.zeros(W.shape[:-2], dtype=torch.float64, device=W.device)
    gram_error = mul_up(sum_upper_bound(square_up(W), (-2, -1)), gamma(k))  # ‖Ĝ − W Wᵀ‖₂ ≤ γ_k ‖W‖_F²
    lam = _cholesky_top_eigenvalue_bound(gram)
    missing = ~torch.isfinite(lam)
    if bool(missing.any()):
        lam = torch.where(missing, _residual_top_eigenvalue_bound(gram), lam)
    return sqrt_up(add_up(lam, gram_error))


def _cholesky_top_eigenvalue_bound(gram: Tensor) -> Tensor:
    """≥ λ_max(Ĝ) for symmetric float matrices Ĝ ``[..., m, m]`` (+∞ where the certificate fails).

    With t ≥ 0 a float, A = fl(t I − Ĝ) differs from t I − Ĝ only on the diagonal, by at most u (t + max|Ĝ_ii|).
    If Cholesky runs to completion on A, its computed factor satisfies L̂L̂ᵀ = A + ΔA with |ΔA| ≤ γ_{m+1}|L̂||L̂|ᵀ
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm 10.3: every entry is one inner product
    evaluated in some order, which also covers the blocked and recursive orders of LAPACK; the constant is
    doubled here as a margin). Then t I − Ĝ ⪰ −(D + ΔA), hence

        λ_max(Ĝ) ≤ t + u (t + max|Ĝ_ii|) + γ_{2m+2} ‖L̂‖_F²,

    needing only an estimate of λ_max to choose t: the computed top eigenvalue plus 4(m + 1)u·tr Ĝ, enlarged
    once more where that factorization fails. No claim on the eigensolver's accuracy enters.
    """
    m = gram.shape[-1]
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    trace = sum_upper_bound(diagonal.abs())
    estimate = torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0.0)
    eye = torch.eye(m, dtype=gram.dtype, device=gram.device)
    result = torch.full_like(estimate, math.inf)
    for margin in (4.0 * (m + 1) * UNIT_ROUNDOFF, 2.0**-20):
        shift = add_up(estimate, mul_up(trace, margin))
        factor, info = torch.linalg.cholesky_ex(shift[..., None, None] * eye - gram)
        done = (info == 0) & ~torch.isfinite(result)
        if bool(done.any()):
            spread = add_up(shift, diagonal.abs().amax(dim=-1))
            bound = add_up(
                add_up(shift, mul_up(spread, UNIT_ROUNDOFF * (1 + 2.0**-50))),
                mul_up(sum_upper_bound(square_up(factor), (-2, -1)), gamma(2 * m + 2)),
            )
            result = torch.where(done, bound, result)
        if bool(torch.isfinite(result).all()):
            break
    return result


def _residual_top_eigenvalue_bound(gram: Tensor) -> Tensor:
    """≥ λ_max(Ĝ) from any computed eigenpairs (V, Λ) and the residual E = Ĝ − V Λ Vᵀ (module docstring, rule 3)."""
    m = gram.shape[-1]
    eigenvalues, V = torch.linalg.eigh(gram)
    top = eigenvalues[..., -1].clamp_min(0.0)
    v_sq = sum_upper_bound(square_up(V), (-2, -1))  # ‖V‖_F²
    eye = torch.eye(m, dtype=torch.float64, device=gram.device)
    orthogonality = add_up(
        mul_up(frobenius_norm_upper_bound(V.transpose(-1, -2) @ V - eye), 1.0 + 4 * UNIT_ROUNDOFF),
        mul_up(v_sq, gamma(m + 1)),
    )
    residual = gram - (V * eigenvalues[..., None, :]) @ V.transpose(-1, -2)
    magnitude = eigenvalues.abs().amax(dim=-1)
    residual_norm = add_up(
        mul_up(frobenius_norm_upper_bound(residual), 1.0 + 4 * UNIT_ROUNDOFF),
        mul_up(mul_up(magnitude, v_sq), 2 * gamma(m + 2)),
    )
    return add_up(mul_up(top, add_up(orthogonality, 1.0)), residual_norm)


def layernorm_scale_lower_bound(x: Tensor, eps: float) -> Tensor:
    """≤ σ(x) = √(mean((x − mean x)²) + ε) per token, in real arithmetic (module docstring).

    Args:
        x: ``[..., d_model]`` (converted to float64 exactly); eps: the ε inside σ (as a float64 value).

    Returns:
        ``[...]`` float64 certified lower bound.
    """
    x = x.to(torch.float64)
    d = x.shape[-1]
    centre = x.mean(dim=-1, keepdim=True)
    y = x - centre  # real x_i − c lies within one ulp of the float y_i (rule 1)
    y_abs_low = round_down(y.abs()).clamp_min(0.0)
    squares = sum_lower_bound(square_down(y_abs_low))
    offset = mean_offset_upper_bound(y)  # ≥ |mean(x) − c|
    variance = sub_down(div_down(squares, float(d)), square_up(offset)).clamp_min(0.0)
    return sqrt_down(add_down(variance, float(eps)))


def rmsnorm_scale_lower_bound(x: Tensor, eps: float) -> Tensor:
    """≤ r(x) = √(mean(x²) + ε) per token, in real arithmetic. ``x``: ``[..., d_model]`` → ``[...]`` float64."""
    x = x.to(torch.float64)
    mean_square = div_down(sum_lower_bound(square_down(x.abs())), float(x.shape[-1]))
    return sqrt_down(add_down(mean_square, float(eps)))
