"""The per-row terms of the local attention bound hold in real arithmetic (attention_accuracy): oracles in exact
rationals and mpmath at 200–400 bits, on the families where the float64 forward or its factors lose what a bound
needs (huge value and key biases, nearly rank-deficient projections, QK-norms near their ε)."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest
import torch

from attnsens import _rounding as rounding
from attnsens.geometry import attention_accuracy as A
from attnsens.geometry import attention_terms as T
from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, causal_mask
from attnsens.geometry.attention_bounds import _mha_local_jacobian_bounds
from attnsens.weights import NormWeights
from tests.helpers.row_accuracy import _exact_block_norm_1d

F64 = torch.float64


def _local_bound_1d(x, wq, wk, wv, wo, bq, bk, bv, tau) -> float:
    def t(a):
        return torch.tensor(a, dtype=F64)

    biases = AttentionBiases(q=t([[bq]]), k=t([[bk]]), v=t([[bv]]))
    X = t([[[v] for v in x]])
    return float(
        _mha_local_jacobian_bounds(
            X,
            _AttentionTensors(
                t([[[wq]]]), t([[[wk]]]), t([[[wv]]]), t([[wo]]), tau=tau, mask=causal_mask(len(x)), biases=biases
            ),
        ).upper_bound
    )


@pytest.mark.parametrize(
    "case",
    [
        # v̂_0 = fl(x_0 + 2^40) drops x_0's last bits: the value spread came out 6·10^-5 short (true ÷ bound 1.00006)
        dict(x=[1 + 2**-14, 0.0], wq=100.0, wk=1.0, wv=1.0, wo=1.0, bq=0.0, bk=0.0, bv=2.0**40, tau=1.0),
        # the same through the keys: k̂_0 − b_K loses 2^-32 of 1 (true ÷ bound 1 + 3·10^-11)
        dict(x=[1 + 2**-32, 0.0], wq=1.0, wk=1.0, wv=1.0, wo=1.0, bq=0.0, bk=2.0**22, bv=0.0, tau=1.0),
        dict(x=[1 + 2**-30, 0.0], wq=3.0, wk=1.0, wv=-1.0, wo=2.0, bq=0.0, bk=2.0**20, bv=2.0**44, tau=0.5),
    ],
)
def test_local_bound_with_huge_value_and_key_biases_is_not_below_the_exact_norm(case: dict) -> None:
    """q_1 = 0 makes row 1 uniform and its bound tight (‖W_V‖ + ¼ Δv W_Q Δk/τ attained), so any loss in the float
    values or keys shows; the bound must use the real values, which the float64 projection rounds."""
    exact = _exact_block_norm_1d(**case)
    bound = _local_bound_1d(**case)
    assert mpmath.mpf(bound) >= exact, (bound, float(exact))
    assert mpmath.mpf(bound) <= exact * (1 + mpmath.mpf(2) ** -5)  # the radii: the input rounding, ≤ 2^-8 here


def _exact_norm(vector: list[Fraction]) -> Fraction:
    return sum(v * v for v in vector)  # the squared norm, compared with squared bounds


def _cases(seed: int, count: int, rows: int, cols: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Nearly rank-deficient W (a last row 2^-k away from a combination of the others) with vectors w in and
    near its left null space, where a float factor's norm is all rounding."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for index in range(count):
        W = torch.randn(rows, cols, generator=gen, dtype=F64)
        mix = torch.randn(rows - 1, generator=gen, dtype=F64)
        W[-1] = mix @ W[:-1] + 2.0 ** -(20 + index % 30) * torch.randn(cols, generator=gen, dtype=F64)
        null = torch.cat([mix, torch.tensor([-1.0], dtype=F64)])
        w = null + 2.0 ** -(index % 40) * torch.randn(rows, generator=gen, dtype=F64)
        cases.append((W, w))
    return cases


def test_gain_factor_bounds_every_functional_norm_in_exact_arithmetic() -> None:
    """‖Wᵀw‖ ≤ scale·fl‖fl(Ĝw)‖ + slack‖w‖ + floor (attention_accuracy, plain side) against exact rationals; the
    slack is needed: without it the bound fails on some of these cases."""
    failures_without_slack = 0
    for W, w in _cases(0, 300, rows=3, cols=5):
        gain = A.gain_accuracy(W[None])
        accuracy = A.plain_factor_accuracy(
            A.GainAccuracy(
                gain=gain.gain[None], **{k: getattr(gain, k)[None] for k in ("basis_norm", "residual", "frobenius")}
            ),
            rounding.spectral_norm_upper_bound(W)[None, None],
        )  # fmt: skip
        computed = torch.linalg.vector_norm(gain.gain[0] @ w)
        scaled = float(rounding.mul_up(computed, accuracy.scale.flatten()[0]))
        bound = scaled + float(accuracy.slack.flatten()[0]) * float(rounding.norm2_upper_bound(w)) + accuracy.floor
        exact = _exact_norm([sum(Fraction(W[i, j].item()) * Fraction(w[i].item()) for i in range(3)) for j in range(5)])
        assert Fraction(bound) ** 2 * (1 + Fraction(1, 2**40)) >= exact
        failures_without_slack += Fraction(scaled) ** 2 < exact
    assert failures_without_slack > 0


def test_output_factor_bounds_every_head_output_norm_in_exact_arithmetic() -> None:
    """‖W_O^(h) z‖ ≤ scale·fl‖fl(R̂_O z)‖ + slack‖z‖ + floor (attention_accuracy.output_accuracy)."""
    failures_without_slack = 0
    for W, z in _cases(1, 300, rows=3, cols=5):
        W = W.T.contiguous()  # W_O^(h): d_model × d_head with nearly dependent columns, z near its null space
        output = A.output_accuracy(W, 1)
        computed = torch.linalg.vector_norm(output.factor[0] @ z)
        scaled = float(rounding.mul_up(computed, output.scale[0]))
        bound = scaled + float(output.slack[0]) * float(rounding.norm2_upper_bound(z)) + output.floor
        exact = _exact_norm([sum(Fraction(W[i, j].item()) * Fraction(z[j].item()) for j in range(3)) for i in range(5)])
        assert Fraction(bound) ** 2 >= exact
        failures_without_slack += Fraction(scaled) ** 2 < exact
    assert failures_without_slack > 0


def _rms_jacobian_mp(a: list, gamma: list, eps: float) -> mpmath.matrix:
    d = len(a)
    r = mpmath.sqrt(mpmath.fsum(t * t for t in a) / d + mpmath.mpf(eps))
    return mpmath.matrix(
        [[gamma[j] * ((1 if j == k else 0) - a[j] * a[k] / (d * r * r)) / r for k in range(d)] for j in range(d)]
    )


def _qk_norm_instance(
    seed: int, d_head: int, d_model: int, n: int, *, bias: float, eps: float, spread: float, beta: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, NormWeights]:
    """One head's projection W [1, d_head, d_model], inputs X [1, n, d_model] (tiny beside a bias below 1, where
    the norm's floor is √ε), bias b ≈ ``bias`` and an RMSNorm QK-norm with γ = 1 + N(0, spread²) and, given
    ``beta``, β ~ N(0, beta²), drawn in that order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(1, d_head, d_model, generator=gen, dtype=F64)
    X = torch.randn(1, n, d_model, generator=gen, dtype=F64) * (1e-4 if bias < 1 else 1.0)
    b = torch.full((1, d_head), bias, dtype=F64) + torch.randn(1, d_head, generator=gen, dtype=F64) * 1e-3
    gamma = 1 + spread * torch.randn(d_head, generator=gen, dtype=F64)
    shift = None if beta is None else beta * torch.randn(d_head, generator=gen, dtype=F64)
    return W, X, b, NormWeights(gamma=gamma, eps=eps, kind="rmsnorm", beta=shift)


@pytest.mark.parametrize(("eps", "bias"), [(1e-6, 0.0), (1e-6, 3e7), (1e-12, 1e-5), (1e-2, 0.3)])
def test_qk_norm_map_error_bounds_the_real_jacobian(eps: float, bias: float) -> None:
    """‖R_t J_N(a_t) − fl(R_t Ĵ_t)‖ ≤ ε_t, a_t the real projection W x_t + b (mpmath, 300 bits)."""
    d_head, d_model, n = 4, 5, 6
    W, X, b, norm = _qk_norm_instance(7, d_head, d_model, n, bias=bias, eps=eps, spread=0.1)
    inputs = torch.einsum("hed,bpd->bhpe", W, X) + b[None, :, None, :]  # â: [b, h, p, d]
    floor, input_error = T.qk_norm_floors(T.projection_magnitudes(X, W, b, 1), norm, inputs, d_model)
    jacobians = T.norm_jacobians(inputs, norm)
    gamma_max = norm.gamma.abs().amax()
    error = A.qk_norm_map_error(jacobians, None, gamma_max, floor, input_error)
    with mpmath.workprec(300):
        g = [mpmath.mpf(v) for v in norm.gamma.tolist()]
        for t in range(n):
            a = [mpmath.fsum(mpmath.mpf(W[0, e, k].item()) * mpmath.mpf(X[0, t, k].item()) for k in range(d_model))
                 + mpmath.mpf(b[0, e].item()) for e in range(d_head)]  # fmt: skip
            real = _rms_jacobian_mp(a, g, eps)
            diff = torch.tensor([[float(real[j, k] - mpmath.mpf(jacobians[0, 0, t, j, k].item()))
                                  for k in range(d_head)]
                                 for j in range(d_head)], dtype=F64)  # fmt: skip
            assert float(torch.linalg.matrix_norm(diff, ord=2)) * (1 + 1e-10) <= float(error[0, 0, t])


def test_joint_qk_norm_factor_bounds_every_functional_norm_in_real_arithmetic() -> None:
    """‖Φ_t w‖ ≤ scale_t·fl‖fl(F̂_t w)‖ + slack_t‖w‖ + floor for a QK-norm over both heads (joint_norm_factors),
    Φ_t w = W_allᵀ J^(h)(a_t)ᵀ R_tᵀ w at the real projection a_t (mpmath, 300 bits)."""
    from attnsens.geometry.attention import apply_rotary
    from attnsens.weights import RotaryConfig

    gen = torch.Generator().manual_seed(3)
    n_head, d_head, d_model, n = 2, 2, 3, 5
    W = torch.randn(n_head, d_head, d_model, generator=gen, dtype=F64)
    X = torch.randn(1, n, d_model, generator=gen, dtype=F64)
    b = torch.randn(n_head, d_head, generator=gen, dtype=F64) * 0.1
    norm = NormWeights(
        gamma=1 + 0.1 * torch.randn(n_head * d_head, generator=gen, dtype=F64), eps=1e-6, kind="rmsnorm", beta=None
    )
    rotary = RotaryConfig(rotary_dim=d_head, base=10000.0)
    rotations = T.rotation_matrices(n, d_head, rotary, X.device)
    assert torch.equal(apply_rotary(torch.eye(d_head, dtype=F64).expand(n, d_head, d_head).transpose(0, 1), rotary)
                       .permute(1, 2, 0), rotations)  # fmt: skip
    inputs = torch.einsum("hed,bpd->bhpe", W, X) + b[None, :, None, :]
    floor, input_error = T.qk_norm_floors(T.projection_magnitudes(X, W, b, n_head), norm, inputs, d_model)
    w_all = rounding.spectral_norm_upper_bound(W.flatten(0, 1)).expand(1, n_head)
    factors, accuracy = T.joint_norm_factors(W, inputs, norm, rotations, floor, input_error, w_all)
    width = n_head * d_head
    for trial in range(20):
        w = torch.randn(d_head, generator=gen, dtype=F64) * 10.0 ** (trial % 5 - 2)
        computed = torch.linalg.vector_norm(factors @ w, dim=-1)  # [1, h, p]
        bound = rounding.add_up(
            rounding.add_up(
                rounding.mul_up(computed, accuracy.scale),
                rounding.mul_up(accuracy.slack, rounding.norm2_upper_bound(w)),
            ),
            accuracy.floor,
        )  # fmt: skip
        with mpmath.workprec(300):
            g = [mpmath.mpf(v) for v in norm.gamma.tolist()]
            for t in range(n):
                a = [mpmath.fsum(mpmath.mpf(W[h, e, k].item()) * mpmath.mpf(X[0, t, k].item()) for k in range(d_model))
                     + mpmath.mpf(b[h, e].item()) for h in range(n_head) for e in range(d_head)]  # fmt: skip
                J = _rms_jacobian_mp(a, g, 1e-6)  # D × D
                rw = [mpmath.fsum(mpmath.mpf(rotations[t, i, j].item()) * mpmath.mpf(w[i].item())
                                  for i in range(d_head))
                      for j in range(d_head)]  # R_tᵀ w  # fmt: skip
                for h in range(n_head):
                    z = [mpmath.fsum(J[h * d_head + i, c] * rw[i] for i in range(d_head)) for c in range(width)]
                    phi = [mpmath.fsum(mpmath.mpf(W[c // d_head, c % d_head, k].item()) * z[c] for c in range(width))
                           for k in range(d_model)]  # fmt: skip
                    real = mpmath.sqrt(mpmath.fsum(v * v for v in phi))
                    assert real <= mpmath.mpf(float(bound[0, h, t])), (trial, t, h)


def test_cholesky_spectral_certificate_holds_on_degenerate_and_random_matrices(monkeypatch) -> None:
    """‖W‖₂ ≤ spectral_norm_upper_bound(W) against 300-bit singular values, on repeated top singular values,
    rank one, tiny and huge scales; also through the eigenvector fallback when every factorization fails."""
    gen = torch.Generator().manual_seed(5)
    matrices = [
        torch.eye(6, dtype=F64),
        torch.ones(4, 7, dtype=F64),
        torch.diag(torch.tensor([3.0, 3.0, 1.0], dtype=F64)),
    ]
    for scale in (1e-150, 1.0, 1e150):
        matrices += [
            torch.randn(5, 8, generator=gen, dtype=F64) * scale,
            torch.randn(9, 3, generator=gen, dtype=F64) * scale,
        ]

    def check() -> None:
        for M in matrices:
            bound = float(rounding.spectral_norm_upper_bound(M, remember=False))
            with mpmath.workprec(300):
                G = mpmath.matrix(M.tolist()) * mpmath.matrix(M.tolist()).T
                top = max(mpmath.eigsy(G, eigvals_only=True))
                assert mpmath.mpf(bound) ** 2 >= top, (M.shape, bound)
                assert mpmath.mpf(bound) ** 2 <= top * (1 + mpmath.mpf(10) ** -8) + mpmath.mpf(10) ** -300

    check()

    def failing(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return A, torch.ones(A.shape[:-2], dtype=torch.int32)  # "not positive definite" everywhere

    monkeypatch.setattr(torch.linalg, "cholesky_ex", failing)
    check()
    assert math.isfinite(float(rounding.spectral_norm_upper_bound(torch.eye(3, dtype=F64), remember=False)))


def test_post_ln_block_bound_with_a_huge_offset_is_not_below_the_300_bit_norm() -> None:
    """A post-LN block whose sublayers vanish is N₂(N₁(x)) per token; at x = 2^60 + 256·k the float64 σ of N₁ used
    to come out 0.15 % high, and the block bound fell below the true ‖J_N₂ J_N₁‖ (aligned projections)."""
    import dataclasses

    from attnsens.geometry import block_local_jacobian_upper_bound
    from tests.unit.geometry.tiny_layers import tiny_layers

    d = 32
    layer = tiny_layers("post", n_layer=1, d_model=d, n_head=2, d_head=4, d_ff=8)[0]
    zero = {k: (None if v is None else torch.zeros_like(v)) for k, v in vars(layer.attention).items()
            if isinstance(v, torch.Tensor) or v is None}  # fmt: skip
    ones = NormWeights(kind="layernorm", gamma=torch.ones(d, dtype=F64), beta=None, eps=1e-5)
    mlp = {k: (None if v is None else torch.zeros_like(v)) for k, v in vars(layer.mlp).items()
           if isinstance(v, torch.Tensor) or v is None}  # fmt: skip
    layer = dataclasses.replace(
        layer, attention=dataclasses.replace(layer.attention, **zero), mlp=dataclasses.replace(layer.mlp, **mlp),
        attn_norm=ones, mlp_norm=ones,
    )  # fmt: skip
    row = [2.0**60 + 256 * k for k in range(d)]
    bound = float(block_local_jacobian_upper_bound(torch.tensor([[row]], dtype=F64), layer)[0])
    with mpmath.workprec(300):

        def jacobian(x: list) -> tuple[mpmath.matrix, list]:
            mean = mpmath.fsum(x) / d
            sigma = mpmath.sqrt(mpmath.fsum((t - mean) ** 2 for t in x) / d + mpmath.mpf(1e-5))
            y = [(t - mean) / sigma for t in x]
            J = mpmath.matrix([[((1 if i == j else 0) - mpmath.mpf(1) / d - y[i] * y[j] / d) / sigma for j in range(d)]
                               for i in range(d)])  # fmt: skip
            return J, y

        J1, y = jacobian([mpmath.mpf(v) for v in row])
        J2, _ = jacobian(y)
        product = J2 * J1
        top = max(mpmath.eigsy(product.T * product, eigvals_only=True))
        assert mpmath.mpf(bound) ** 2 >= top, (bound, float(mpmath.sqrt(top)))


def _one_unit_mlp(activation_name: str, w_in: list[float], b_in: float) -> object:
    from attnsens.weights import MLPWeights

    return MLPWeights(
        kind="mlp", activation=activation_name, w_in=torch.tensor([w_in], dtype=F64),
        w_out=torch.tensor([[1.0], [2.0]], dtype=F64), b_in=torch.tensor([b_in], dtype=F64), b_out=None,
        w_gate=None, b_gate=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "x", "w_in", "b_in"),
    [
        # the float pre-activation fl(1 + 2^-60) − 1 = 0 has relu' = 0; the real one is 2^-60 > 0, slope 1
        ("relu", [1.0, 2.0**-60], [1.0, 1.0], -1.0),
        # fl(2^40 + 0.50005) rounds the pre-activation down to 0.5, where gelu' is smaller than at the real 0.50005
        ("gelu", [2.0**40, 0.5 + 0.4 * 2.0**-13], [1.0, 1.0], -(2.0**40)),
        ("gelu_tanh", [2.0**40, 0.5 + 0.4 * 2.0**-13], [1.0, 1.0], -(2.0**40)),
        ("silu", [2.0**40, -1.5 + 0.4 * 2.0**-13], [1.0, 1.0], -(2.0**40)),
    ],
)
def test_ffn_token_bound_follows_the_real_pre_activation(name: str, x: list[float], w_in: list, b_in: float) -> None:
    """One hidden unit: Dφ(x) = w_out act'(z) w_inᵀ has norm ‖w_out‖ |act'(z)| ‖w_in‖ exactly, z = w_in·x + b the
    real pre-activation (300-bit); the float one differs, and the bound must follow the real slope."""
    from attnsens.geometry.blocks import ffn_token_jacobian_upper_bound

    bound = float(ffn_token_jacobian_upper_bound(torch.tensor([[x]], dtype=F64), _one_unit_mlp(name, w_in, b_in))[0, 0])
    with mpmath.workprec(300):
        z = mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(w_in, x, strict=True)) + mpmath.mpf(b_in)
        c, k = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")
        act = {
            "relu": lambda t: max(t, 0),
            "gelu": lambda t: t * mpmath.ncdf(t),
            "gelu_tanh": lambda t: t / 2 * (1 + mpmath.tanh(c * (t + k * t**3))),
            "silu": lambda t: t / (1 + mpmath.exp(-t)),
        }[name]
        slope = (1 if z > 0 else 0) if name == "relu" else mpmath.diff(act, z)
        exact = mpmath.sqrt(5) * abs(slope) * mpmath.sqrt(mpmath.fsum(mpmath.mpf(w) ** 2 for w in w_in))
    assert mpmath.mpf(bound) >= exact, (bound, float(exact))


def test_activation_curvature_constants_hold_on_a_fine_grid() -> None:
    """ACTIVATION_CURVATURE ≥ max |act''| on [−8, 8]: the grid maximum plus half a step times max |act'''|."""
    from attnsens.geometry.blocks import ACTIVATION_CURVATURE

    c, k = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")
    functions = {
        "gelu": lambda t: t * mpmath.ncdf(t),
        "gelu_tanh": lambda t: t / 2 * (1 + mpmath.tanh(c * (t + k * t**3))),
        "silu": lambda t: t / (1 + mpmath.exp(-t)),
        "quick_gelu": lambda t: t / (1 + mpmath.exp(-mpmath.mpf("1.702") * t)),
    }
    with mpmath.workdps(25):
        for name, f in functions.items():
            grid = [mpmath.mpf(-8) + mpmath.mpf(16) * i / 800 for i in range(801)]
            second = max(abs(mpmath.diff(f, t, 2)) for t in grid)
            third = max(abs(mpmath.diff(f, t, 3)) for t in grid)
            assert second + third * mpmath.mpf(16) / 800 / 2 <= ACTIVATION_CURVATURE[name], name


def test_distances_are_formed_from_differences_as_the_radius_assumes() -> None:
    """norm_upper's relative radius holds only if torch.cdist (donot_use_mm_for_euclid_dist) subtracts before it
    squares: near-equal points of magnitude 2^40 keep their distance to the last bits (the Gram formula would not)."""
    gen = torch.Generator().manual_seed(9)
    base = 2.0**40 + torch.randn(1, 6, 5, generator=gen, dtype=F64)
    points = base + torch.randn(1, 6, 5, generator=gen, dtype=F64) * 2.0**-10
    computed = torch.cdist(base, points, compute_mode="donot_use_mm_for_euclid_dist")
    bounded = A.norm_upper(computed, 5)
    for i in range(6):
        for j in range(6):
            exact = sum((Fraction(base[0, i, k].item()) - Fraction(points[0, j, k].item())) ** 2 for k in range(5))
            assert Fraction(bounded[0, i, j].item()) ** 2 >= exact
            assert Fraction(computed[0, i, j].item()) ** 2 >= exact * (1 - Fraction(1, 2**40))


@pytest.mark.parametrize(("eps", "bias"), [(1e-6, 0.0), (1e-6, 3e7), (1e-12, 1e-5), (1e-2, 0.3)])
def test_qk_norm_after_rope_floor_errors_and_map_error_hold_in_real_arithmetic(eps: float, bias: float) -> None:
    """A per-head norm after RoPE (HunYuan): at the real input ρ_t = R_t a_t of the norm (R_t the forward's cos/sin
    table, a_t = W x_t + b), r(ρ_t) ≥ r_lo, ‖ρ_t − ρ̂_t‖ ≤ e_ρ, ‖N(ρ_t) − N̂_t‖ ≤ the projection error and
    ‖J_N(ρ_t) R_t − fl(Ĵ_t R_t)‖ ≤ ε_t, for the float ρ̂_t = fl(R_t â_t) and N̂_t (mpmath, 300 bits)."""
    from attnsens.geometry.attention import apply_rotary, qk_norm_forward
    from attnsens.weights import RotaryConfig

    d_head, d_model, n = 6, 5, 7
    rotary = RotaryConfig(base=10.0, rotary_dim=4)
    W, X, b, norm = _qk_norm_instance(8, d_head, d_model, n, bias=bias, eps=eps, spread=0.3)
    projected = torch.einsum("hed,bpd->bhpe", W, X) + b[None, :, None, :]  # â: [b, h, p, d]
    rotated = apply_rotary(projected, rotary)  # ρ̂ = fl(R_t â_t)
    rotations = T.rotation_matrices(n, d_head, rotary, X.device)
    rotation_norm = A.schur_norm_upper_bound(rotations)
    magnitude = T.projection_magnitudes(X, W, b, 1)
    floor, input_error = T.qk_norm_floors(magnitude, norm, rotated, d_model, rotation_norm=rotation_norm)
    errors = T.projection_errors(magnitude, norm, rotated, d_model, rotation_norm=rotation_norm)
    normalized = qk_norm_forward(rotated, norm)
    jacobians = T.norm_jacobians(rotated, norm)
    maps = jacobians @ rotations
    map_error = A.qk_norm_map_error(jacobians, rotations, norm.gamma.abs().amax(), floor, input_error)
    with mpmath.workprec(300):
        g = [mpmath.mpf(v) for v in norm.gamma.tolist()]
        for t in range(n):
            a = [mpmath.fsum(mpmath.mpf(W[0, e, k].item()) * mpmath.mpf(X[0, t, k].item()) for k in range(d_model))
                 + mpmath.mpf(b[0, e].item()) for e in range(d_head)]  # fmt: skip
            R = mpmath.matrix(rotations[t].tolist())
            rho = R * mpmath.matrix(a)
            r = mpmath.sqrt(mpmath.fsum(v * v for v in rho) / d_head + mpmath.mpf(eps))
            assert mpmath.mpf(floor[0, 0, t].item()) <= r
            moved = mpmath.sqrt(mpmath.fsum((rho[e] - mpmath.mpf(rotated[0, 0, t, e].item())) ** 2
                                            for e in range(d_head)))  # fmt: skip
            assert moved <= mpmath.mpf(input_error[0, 0, t].item())
            off = mpmath.sqrt(mpmath.fsum((g[e] * rho[e] / r - mpmath.mpf(normalized[0, 0, t, e].item())) ** 2
                                          for e in range(d_head)))  # fmt: skip
            assert off <= mpmath.mpf(errors[0, 0, t].item())
            real = _rms_jacobian_mp(list(rho), g, eps) * R
            diff = torch.tensor([[float(real[j, k] - mpmath.mpf(maps[0, 0, t, j, k].item())) for k in range(d_head)]
                                 for j in range(d_head)], dtype=F64)  # fmt: skip
            assert float(torch.linalg.matrix_norm(diff, ord=2)) * (1 + 1e-10) <= float(map_error[0, 0, t])


@pytest.mark.parametrize(("eps", "bias", "shift"), [(1e-6, 0.0, 1.0), (1e-6, 3e7, 40.0), (1e-12, 1e-5, 1e-3)])
def test_qk_norm_with_beta_errors_and_norm_hold_in_real_arithmetic(eps: float, bias: float, shift: float) -> None:
    """A per-head norm before RoPE with a beta (a LayerNorm QK-norm read centred, Persimmon): at the real vector
    ṽ_t = R_t(N(a_t) + β), ‖ṽ_t − fl(R_t fl(N̂(â_t) + β))‖ ≤ E and ‖ṽ_t‖ ≤ N (``_side_error``; mpmath, 300
    bits), with β up to 40 times γ_max √d_head, where a forgotten rounding of the sum would show."""
    from attnsens.geometry.attention import apply_rotary, qk_norm_forward
    from attnsens.weights import RotaryConfig

    d_head, d_model, n = 6, 5, 7
    rotary = RotaryConfig(base=10.0, rotary_dim=4)
    W, X, b, norm = _qk_norm_instance(9, d_head, d_model, n, bias=bias, eps=eps, spread=0.3, beta=shift)
    projected = torch.einsum("hed,bpd->bhpe", W, X) + b[None, :, None, :]
    computed = apply_rotary(qk_norm_forward(projected, norm), rotary)
    rotations = T.rotation_matrices(n, d_head, rotary, X.device)
    magnitude = T.projection_magnitudes(X, W, b, 1)
    errors, sizes = T._side_error(magnitude, norm, projected, d_model)
    with mpmath.workprec(300):
        g = [mpmath.mpf(v) for v in norm.gamma.tolist()]
        beta = [mpmath.mpf(v) for v in norm.beta.tolist()]
        for t in range(n):
            a = [mpmath.fsum(mpmath.mpf(W[0, e, k].item()) * mpmath.mpf(X[0, t, k].item()) for k in range(d_model))
                 + mpmath.mpf(b[0, e].item()) for e in range(d_head)]  # fmt: skip
            r = mpmath.sqrt(mpmath.fsum(v * v for v in a) / d_head + mpmath.mpf(eps))
            real = mpmath.matrix(rotations[t].tolist()) * mpmath.matrix(
                [g[e] * a[e] / r + beta[e] for e in range(d_head)]
            )
            off = mpmath.sqrt(mpmath.fsum((real[e] - mpmath.mpf(computed[0, 0, t, e].item())) ** 2
                                          for e in range(d_head)))  # fmt: skip
            assert off <= mpmath.mpf(errors[0, 0, t].item())
            assert mpmath.sqrt(mpmath.fsum(v * v for v in real)) <= mpmath.mpf(sizes[0, 0, t].item())
