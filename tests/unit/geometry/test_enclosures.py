"""Forward enclosures and the block chain rule against 300-bit mpmath: every factor of a block bound is bounded
over a proved ball around its float64 argument, so the bound holds for the real intermediates even where float64
loses them (inputs at 2^60, huge biases). Each family also shows that the point-evaluated factor is too small."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from attnsens.geometry import block_local_jacobian_upper_bound
from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, causal_mask
from attnsens.geometry.attention_bounds import _mha_local_jacobian_bounds, mha_local_jacobian_bounds
from attnsens.geometry.blocks import ffn_local_jacobian_upper_bound, mlp_enclosure
from attnsens.geometry.enclosures import Enclosure, exact, norm_enclosure, residual_sum
from attnsens.geometry.jacobians import norm_jacobian_spectral_norm_upper_bound
from attnsens.geometry.layers import attention_sublayer, norm_forward
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, NormWeights
from tests.helpers.row_accuracy import _exact_block_norm_1d

F64 = torch.float64
PREC = 300


def _mp_norm(x: list, gamma: list, beta: list | None, eps: float, kind: str) -> list:
    d = len(x)
    if kind == "layernorm":
        mean = mpmath.fsum(x) / d
        x = [t - mean for t in x]
    scale = mpmath.sqrt(mpmath.fsum(t * t for t in x) / d + mpmath.mpf(eps))
    return [gamma[i] * x[i] / scale + (0 if beta is None else beta[i]) for i in range(d)]


def _mp_distance(a: list, b) -> mpmath.mpf:
    return mpmath.sqrt(mpmath.fsum((a[i] - mpmath.mpf(float(b[i]))) ** 2 for i in range(len(a))))


def _mp_vector(t: torch.Tensor) -> list:
    return [mpmath.mpf(float(v)) for v in t]


def _norm_weights(d: int, kind: str, *, seed: int = 0, eps: float = 1e-5) -> NormWeights:
    g = torch.Generator().manual_seed(seed)
    gamma = 1 + 0.3 * torch.randn(d, generator=g, dtype=F64)
    beta = 0.2 * torch.randn(d, generator=g, dtype=F64) if kind == "layernorm" else None
    return NormWeights(kind=kind, gamma=gamma, beta=beta, eps=eps)


def _inputs(family: str, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if family == "offset":  # float64 centring loses up to half the spread
        return torch.tensor([2.0**60 + 256 * k for k in (3, 2, 1, 0, 1, 1, 0, 1)][:d], dtype=F64)
    if family == "tiny":  # σ far below √ε
        return 1e-9 * torch.randn(d, generator=g, dtype=F64)
    return 3 * torch.randn(d, generator=g, dtype=F64) + 5


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("family", ["plain", "offset", "tiny"])
@pytest.mark.parametrize("radius", [0.0, 0.25])
def test_norm_enclosure_contains_the_real_norm_of_every_nearby_input(kind: str, family: str, radius: float) -> None:
    """‖N(X) − N̂(x̂)‖ ≤ the enclosure's radius for the real input X = x̂ and for X on the sphere of the input radius
    (towards and away from the mean, where σ changes fastest, and along a random direction)."""
    d = 8
    norm = _norm_weights(d, kind)
    x = _inputs(family, d)
    enclosure = norm_enclosure(Enclosure(x[None, None], torch.full((1, 1), radius, dtype=F64)), norm)
    bound = mpmath.mpf(float(enclosure.radius[0, 0]))
    with mpmath.workprec(PREC):
        xs, gamma = _mp_vector(x), _mp_vector(norm.gamma)
        beta = None if norm.beta is None else _mp_vector(norm.beta)
        mean = mpmath.fsum(xs) / d if kind == "layernorm" else 0
        spread = [t - mean for t in xs]
        g = torch.Generator().manual_seed(5)
        directions = [spread, [-t for t in spread], _mp_vector(torch.randn(d, generator=g, dtype=F64))]
        worst = mpmath.mpf(0)
        for direction in directions:
            length = mpmath.sqrt(mpmath.fsum(t * t for t in direction))
            point = [xs[i] + mpmath.mpf(radius) * direction[i] / length for i in range(d)] if length else xs
            worst = max(worst, _mp_distance(_mp_norm(point, gamma, beta, norm.eps, kind), enclosure.value[0, 0]))
        assert worst <= bound, (float(worst), float(bound))
    if family == "offset" and kind == "layernorm" and radius == 0:
        assert worst > 0.1  # the float64 N̂(x̂) is far from the real one: a zero radius would be wrong


def _mp_norm_jacobian_norm(x: list, gamma: list, eps: float, kind: str) -> mpmath.mpf:
    d = len(x)
    step = mpmath.mpf(2) ** -100
    columns = []
    for m in range(d):
        up, down = list(x), list(x)
        up[m] += step
        down[m] -= step
        f_up, f_down = _mp_norm(up, gamma, None, eps, kind), _mp_norm(down, gamma, None, eps, kind)
        columns.append([(f_up[i] - f_down[i]) / (2 * step) for i in range(d)])
    J = mpmath.matrix([[columns[m][i] for m in range(d)] for i in range(d)])
    return mpmath.sqrt(max(mpmath.eigsy(J.T * J, eigvals_only=True)))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_factor_with_a_radius_bounds_the_jacobian_on_the_whole_ball(kind: str) -> None:
    """Shrinking x̂'s spread by the radius lowers σ by δ/√d, the most the ball allows: the Jacobian there exceeds
    the bound at x̂, and the bound with the radius covers it."""
    d, delta = 6, 0.9
    norm = _norm_weights(d, kind, seed=2, eps=1e-3)
    x = _inputs("plain", d) * 0.3
    with mpmath.workprec(PREC):
        xs, gamma = _mp_vector(x), _mp_vector(norm.gamma)
        mean = mpmath.fsum(xs) / d if kind == "layernorm" else 0
        spread = [t - mean for t in xs]
        length = mpmath.sqrt(mpmath.fsum(t * t for t in spread))
        point = [xs[i] - delta * spread[i] / length for i in range(d)]
        true = _mp_norm_jacobian_norm(point, gamma, norm.eps, kind)
    at_point = float(norm_jacobian_spectral_norm_upper_bound(x, norm.gamma, norm.eps, kind))
    over_ball = norm_jacobian_spectral_norm_upper_bound(
        x, norm.gamma, norm.eps, kind, input_radius=torch.tensor(delta, dtype=F64)
    )
    assert mpmath.mpf(float(over_ball)) >= true
    assert mpmath.mpf(at_point) < true  # mutation: without the radius the factor is too small


def _scalar_attention_case(bv: float = 0.0, wq: float = 3.0) -> dict:
    return dict(wq=wq, wk=1.0, wv=1.0, wo=2.0, bq=0.0, bk=0.0, bv=bv, tau=1.0)


def _scalar_bound(x: list, case: dict, radius: float | None):
    def t(a):
        return torch.tensor(a, dtype=F64)

    biases = AttentionBiases(q=t([[case["bq"]]]), k=t([[case["bk"]]]), v=t([[case["bv"]]]))
    return _mha_local_jacobian_bounds(
        t([[[v] for v in x]]),
        _AttentionTensors(
            t([[[case["wq"]]]]),
            t([[[case["wk"]]]]),
            t([[[case["wv"]]]]),
            t([[case["wo"]]]),
            tau=case["tau"],
            mask=causal_mask(len(x)),
            biases=biases,
        ),
        input_radius=None if radius is None else torch.full((1, len(x)), radius, dtype=F64),
    )


def _mp_scalar_attention(x: list, case: dict) -> list:
    wq, wk, wv, wo, bq, bk, bv, tau = (mpmath.mpf(case[k]) for k in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "tau"))
    out = []
    for i in range(len(x)):
        scores = [(wq * x[i] + bq) * (wk * x[j] + bk) / tau for j in range(i + 1)]
        top = max(scores)
        weights = [mpmath.exp(s - top) for s in scores]
        total = mpmath.fsum(weights)
        out.append(wo * mpmath.fsum(weights[j] / total * (wv * x[j] + bv) for j in range(i + 1)))
    return out


CORNERS = [(-1, -1, -1), (-1, 1, -1), (1, -1, 1), (1, 1, 1), (0, 1, -1), (1, 0, -1), (-1, 1, 1), (1, -1, -1)]


@pytest.mark.parametrize("radius", [1e-10, 1e-9])
def test_attention_bound_with_a_radius_holds_at_every_sampled_input_of_the_ball(radius: float) -> None:
    """d_model = 1 makes the block-∞ norm exact (the Jacobian's ∞-norm, 400 bits). q_1 = 0 makes row 1 uniform
    and the bound at X tight, so the exact norm at the ball's corners exceeds it; the bound with the radius covers
    every corner and edge midpoint."""
    x, case = [1.0, 0.0], dict(wq=100.0, wk=1.0, wv=1.0, wo=1.0, bq=0.0, bk=0.0, bv=0.0, tau=1.0)
    over_ball = float(_scalar_bound(x, case, radius).upper_bound)
    at_centre = float(_scalar_bound(x, case, None).upper_bound)
    signs = [(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)]
    exact_norms = [_exact_block_norm_1d([x[i] + s[i] * radius for i in range(2)], **case) for s in signs]
    assert all(mpmath.mpf(over_ball) >= e for e in exact_norms), (over_ball, [float(e) for e in exact_norms])
    assert max(exact_norms) > at_centre  # mutation: the centre's bound does not cover the ball
    assert over_ball <= at_centre * (1 + 1e4 * radius)  # the radius costs in proportion to its size


def test_attention_refuses_a_radius_beyond_the_certified_softmax_range() -> None:
    """A radius that moves the scores by more than the softmax accuracy certifies is refused, naming the radius."""
    from attnsens.errors import InputError

    with pytest.raises(InputError, match="input radius"):
        _scalar_bound([0.3, -0.8, 1.1], _scalar_attention_case(), 0.05)


@pytest.mark.parametrize(
    "x, case, radius",
    [
        ([0.3, -0.8, 1.1], _scalar_attention_case(), 0.0),
        ([0.3, -0.8, 1.1], _scalar_attention_case(), 1e-8),
        ([1 + 2**-14, 0.0, 0.5], _scalar_attention_case(bv=2.0**40), 0.0),  # v̂ rounds the input away
        ([1 + 2**-14, 0.0, 0.5], _scalar_attention_case(bv=2.0**40), 1e-9),
        ([40.0, 39.0, -41.0], _scalar_attention_case(wq=30.0), 1e-12),  # scores of 5·10^4: steep rows
    ],
)
def test_attention_output_enclosure_contains_the_real_output(x: list, case: dict, radius: float) -> None:
    """‖MHA(U)_i − ẑ_i‖ ≤ output_radius_i at U = X and at the ball's corners (400-bit softmax)."""
    bound = _scalar_bound(x, case, radius if radius else None)
    with mpmath.workprec(400):
        worst = [mpmath.mpf(0)] * 3
        for signs in CORNERS if radius else [(0, 0, 0)]:
            point = [mpmath.mpf(x[i]) + signs[i] * mpmath.mpf(radius) for i in range(3)]
            out = _mp_scalar_attention(point, case)
            worst = [max(worst[i], abs(out[i] - mpmath.mpf(float(bound.output[0, i, 0])))) for i in range(3)]
    for i in range(3):
        assert worst[i] <= mpmath.mpf(float(bound.output_radius[0, i])), (i, float(worst[i]), bound.output_radius)
    if case["bv"] and not radius:
        assert max(worst) > 1e-5  # the float output really is off: a zero radius would be wrong


def _mp_mlp(x: list, mlp: MLPWeights) -> list:
    def act(z):
        if mlp.activation == "silu":
            return z / (1 + mpmath.exp(-z))
        if mlp.activation == "gelu":
            return z * (1 + mpmath.erf(z / mpmath.sqrt(2))) / 2
        return max(z, 0)

    def rows(W, b):
        return [mpmath.fsum(mpmath.mpf(float(W[j, i])) * x[i] for i in range(len(x))) + (0 if b is None else
                mpmath.mpf(float(b[j]))) for j in range(W.shape[0])]  # fmt: skip

    up = rows(mlp.w_in, mlp.b_in)
    if mlp.kind == "gated":
        hidden = [act(g) * u for g, u in zip(rows(mlp.gate, mlp.b_gate), up, strict=True)]
    else:
        hidden = [act(u) for u in up]
    bias = [0] * mlp.w_out.shape[0] if mlp.b_out is None else _mp_vector(mlp.b_out)
    return [
        mpmath.fsum(mpmath.mpf(float(mlp.w_out[i, j])) * hidden[j] for j in range(len(hidden))) + bias[i]
        for i in range(mlp.w_out.shape[0])
    ]


@pytest.mark.parametrize("kind, activation", [("mlp", "gelu"), ("mlp", "relu"), ("gated", "silu")])
@pytest.mark.parametrize("radius", [0.0, 0.3])
def test_mlp_enclosure_contains_the_real_output(kind: str, activation: str, radius: float) -> None:
    """‖φ(X) − φ̂(x̂)‖ ≤ the MLP enclosure's radius at X = x̂ and on the sphere of the input radius, with a bias of
    2^30 that float64 pre-activations round."""
    d, hidden = 4, 6
    g = torch.Generator().manual_seed(11)
    W = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    b_in = W(hidden)
    b_in[0] = 2.0**30 + 0.3
    mlp = MLPWeights(
        kind=kind, activation=activation, w_in=W(hidden, d), w_out=W(d, hidden) / 3, b_in=b_in, b_out=W(d),
        w_gate=W(hidden, d) if kind == "gated" else None, b_gate=W(hidden) if kind == "gated" else None,
    )  # fmt: skip
    x = W(d)
    enclosure = mlp_enclosure(Enclosure(x[None, None], torch.full((1, 1), radius, dtype=F64)), mlp)
    with mpmath.workprec(PREC):
        xs = _mp_vector(x)
        directions = [[mpmath.mpf(0)] * d] if not radius else [_mp_vector(W(d)) for _ in range(4)]
        worst = mpmath.mpf(0)
        for direction in directions:
            length = mpmath.sqrt(mpmath.fsum(t * t for t in direction)) or 1
            point = [xs[i] + mpmath.mpf(radius) * direction[i] / length for i in range(d)]
            worst = max(worst, _mp_distance(_mp_mlp(point, mlp), enclosure.value[0, 0]))
    assert worst <= mpmath.mpf(float(enclosure.radius[0, 0])), (float(worst), float(enclosure.radius[0, 0]))


def test_residual_sum_radius_covers_the_rounding_of_the_sum() -> None:
    """fl(2^60 + 100.3) drops the 100.3 almost entirely; the radius of the sum covers what float64 lost."""
    x = exact(torch.tensor([[[2.0**60, 1.0]]], dtype=F64))
    a = exact(torch.tensor([[[100.3, 2.0**-60]]], dtype=F64))
    for scale in (1.0, 0.7):
        total = residual_sum(x, a, scale)
        with mpmath.workprec(PREC):
            real = [mpmath.mpf(scale) * mpmath.mpf(float(x.value[0, 0, i])) + mpmath.mpf(float(a.value[0, 0, i]))
                    for i in range(2)]  # fmt: skip
            error = _mp_distance(real, total.value[0, 0])
        assert error <= mpmath.mpf(float(total.radius[0, 0]))
        assert error > 0


def _pre_ln_layer(value_scale: float, d: int = 8) -> LayerWeights:
    """One-token pre-LN block whose sublayers are linear: A(h) = c·h, F(g) = relu(10³ g + 10⁵) (always active), so
    the block Jacobian is (I + 10³ J_N₂(y))(I + c J_N₁(x)) and its bound is tight on the common eigenvectors."""
    eye = torch.eye(d, dtype=F64)
    attention = AttentionWeights(
        w_q=eye[None].clone(), w_k=eye[None].clone(), w_v=eye[None].clone(), w_o=value_scale * eye, tau=1.0,
        causal=True,
    )  # fmt: skip
    mlp = MLPWeights(
        kind="mlp", activation="relu", w_in=1e3 * eye, w_out=eye.clone(), b_in=torch.full((d,), 1e5, dtype=F64),
        b_out=None, w_gate=None, b_gate=None,
    )  # fmt: skip
    norm = NormWeights(kind="layernorm", gamma=torch.ones(d, dtype=F64), beta=None, eps=1e-5)
    return LayerWeights(index=0, placement="pre", attention=attention, mlp=mlp, attn_norm=norm, mlp_norm=norm)


def _mp_pre_ln_jacobian_norm(row: list, value_scale: float) -> mpmath.mpf:
    d = len(row)

    def block(x: list) -> list:
        h = _mp_norm(x, [1] * d, None, 1e-5, "layernorm")
        y = [x[i] + value_scale * h[i] for i in range(d)]
        g = _mp_norm(y, [1] * d, None, 1e-5, "layernorm")
        return [y[i] + max(1000 * g[i] + 100000, 0) for i in range(d)]

    with mpmath.workprec(PREC):
        x, step = [mpmath.mpf(v) for v in row], mpmath.mpf(2) ** -120
        columns = []
        for m in range(d):
            up, down = list(x), list(x)
            up[m] += step
            down[m] -= step
            f_up, f_down = block(up), block(down)
            columns.append([(f_up[i] - f_down[i]) / (2 * step) for i in range(d)])
        J = mpmath.matrix([[columns[m][i] for m in range(d)] for i in range(d)])
        return mpmath.sqrt(max(mpmath.eigsy(J.T * J, eigvals_only=True)))


def _point_evaluated_pre_ln_bound(x: torch.Tensor, layer: LayerWeights) -> float:
    """The chain rule with every factor at its float64 intermediate and no radius (the mutation)."""
    norm = layer.attn_norm
    assert norm is not None

    def norm_factor(z: torch.Tensor) -> float:
        return float(norm_jacobian_spectral_norm_upper_bound(z, norm.gamma, norm.eps, norm.kind).amax())

    h = norm_forward(x, norm)
    first = 1 + norm_factor(x) * float(mha_local_jacobian_bounds(h, layer.attention).upper_bound)
    y = x + attention_sublayer(h, layer.attention)
    return first * (1 + norm_factor(y) * float(ffn_local_jacobian_upper_bound(norm_forward(y, norm), layer.mlp)))


@pytest.mark.parametrize(
    "ks, value_scale",
    [((3, 2, 1, 0, 1, 1, 0, 1), 182.0), ((1, 0, 0, 1, 2, 2, 2, 0), 351.0), ((2, 0, 2, 0, 0, 2, 1, 1), 176.0)],
)
def test_pre_ln_block_bound_at_a_huge_offset_is_not_below_the_300_bit_norm(ks: tuple, value_scale: float) -> None:
    """x = 2^60 + 256·k: float64 loses half of N₁(x) and of x + A(N₁(x)); evaluated there without radii the
    second factor used to come out up to 9 % below the real one, and the block bound below the true norm."""
    row = [2.0**60 + 256 * k for k in ks]
    x = torch.tensor([[row]], dtype=F64)
    layer = _pre_ln_layer(value_scale)
    true = _mp_pre_ln_jacobian_norm(row, value_scale)
    bound = float(block_local_jacobian_upper_bound(x, layer)[0])
    assert mpmath.mpf(bound) >= true, (bound, float(true))
    assert mpmath.mpf(_point_evaluated_pre_ln_bound(x, layer)) < true  # mutation: the old chain rule
    assert math.isfinite(bound)


def _mp_matrix(W: torch.Tensor) -> list:
    return [[mpmath.mpf(float(v)) for v in row] for row in W]


def _mp_apply(W: list, x: list, b: torch.Tensor | None = None) -> list:
    out = [mpmath.fsum(row[i] * x[i] for i in range(len(x))) for row in W]
    return out if b is None else [out[j] + mpmath.mpf(float(b[j])) for j in range(len(out))]


def _mp_attention(tokens: list, attention: AttentionWeights) -> list:
    """Causal MHA of ``attention`` (no RoPE or QK-norm) in mpmath, token by token."""
    n_head = attention.w_q.shape[0]
    group = n_head // attention.w_k.shape[0]
    heads = []
    for h in range(n_head):
        g = h // group
        q = [_mp_apply(_mp_matrix(attention.w_q[h]), t, None if attention.b_q is None else attention.b_q[h])
             for t in tokens]  # fmt: skip
        k = [_mp_apply(_mp_matrix(attention.w_k[g]), t, None if attention.b_k is None else attention.b_k[g])
             for t in tokens]  # fmt: skip
        v = [_mp_apply(_mp_matrix(attention.w_v[g]), t, None if attention.b_v is None else attention.b_v[g])
             for t in tokens]  # fmt: skip
        rows = []
        for i in range(len(tokens)):
            scores = [mpmath.fsum(a * b for a, b in zip(q[i], k[j], strict=True)) / attention.tau for j in range(i + 1)]
            top = max(scores)
            weights = [mpmath.exp(s - top) for s in scores]
            total = mpmath.fsum(weights)
            rows.append([mpmath.fsum(weights[j] / total * v[j][e] for j in range(i + 1)) for e in range(len(v[0]))])
        heads.append(rows)
    w_o = _mp_matrix(attention.w_o)
    return [_mp_apply(w_o, [c for h in range(n_head) for c in heads[h][i]], attention.b_o) for i in range(len(tokens))]


def _mp_block(tokens: list, layer: LayerWeights) -> list:
    """One block of any placement (``LayerWeights``) in mpmath, as ``layers.block_forward`` computes it."""

    def norm(x: list, weights: NormWeights | None) -> list:
        if weights is None:
            return x
        beta = None if weights.beta is None else _mp_vector(weights.beta)
        return _mp_norm(x, _mp_vector(weights.gamma), beta, weights.eps, weights.kind)

    def add(a: list, b: list, scale: float = 1.0) -> list:
        return [[scale * s + t for s, t in zip(u, w, strict=True)] for u, w in zip(a, b, strict=True)]

    mlp = [lambda t: _mp_mlp(t, layer.mlp)][0]
    if layer.parallel_residual:
        attn = _mp_attention([norm(t, layer.attn_norm) for t in tokens], layer.attention)
        return add(add(tokens, attn), [mlp(norm(t, layer.mlp_norm)) for t in tokens])
    if layer.placement == "post":
        alpha = layer.residual_scale
        y = [norm(t, layer.attn_norm) for t in add(tokens, _mp_attention(tokens, layer.attention), alpha)]
        return [norm(t, layer.mlp_norm) for t in add(y, [mlp(t) for t in y], alpha)]
    attn = _mp_attention([norm(t, layer.attn_norm) for t in tokens], layer.attention)
    h = add(tokens, [norm(t, layer.attn_out_norm) for t in attn])
    return add(h, [norm(mlp(norm(t, layer.mlp_norm)), layer.mlp_out_norm) for t in h])


def _mp_block_jacobian_lower_bound(x: torch.Tensor, layer: LayerWeights) -> mpmath.mpf:
    """max_{i,j} ‖∂y_i/∂x_j‖₂ ≤ ‖D block(X)‖_{b∞→b∞} (a perturbation of one token), by 300-bit central
    differences; equal to the norm for one token."""
    n, d = x.shape[-2:]
    with mpmath.workprec(PREC):
        tokens = [_mp_vector(x[0, t]) for t in range(n)]
        step = mpmath.mpf(2) ** -120
        columns = {}
        for j in range(n):
            for m in range(d):
                up = [list(t) for t in tokens]
                down = [list(t) for t in tokens]
                up[j][m] += step
                down[j][m] -= step
                f_up, f_down = _mp_block(up, layer), _mp_block(down, layer)
                columns[j, m] = [[(f_up[i][e] - f_down[i][e]) / (2 * step) for e in range(d)] for i in range(n)]
        best = mpmath.mpf(0)
        for i in range(n):
            for j in range(n):
                J = mpmath.matrix([[columns[j, m][i][e] for m in range(d)] for e in range(d)])
                best = max(best, mpmath.sqrt(max(mpmath.eigsy(J.T * J, eigvals_only=True))))
        return best


def _tiny_block(placement: str, *, out_norms: bool = False, parallel: bool = False) -> LayerWeights:
    import dataclasses

    from tests.unit.geometry.tiny_layers import tiny_layers

    layer = tiny_layers(placement, n_layer=1, d_model=6, n_head=2, d_head=3, d_ff=8, out_norms=out_norms, seed=4)[0]
    return dataclasses.replace(layer, parallel_residual=True) if parallel else layer


BLOCKS = {
    "pre": dict(placement="pre"),
    "parallel": dict(placement="pre", parallel=True),
    "pre_out_norms": dict(placement="pre", out_norms=True),
    "none_out_norms": dict(placement="none", out_norms=True),
    "post": dict(placement="post"),
    "none": dict(placement="none"),
}


NORMALIZED_ATTENTION_INPUT = ("pre", "parallel", "pre_out_norms")  # attention reads N₁(x), not x


@pytest.mark.parametrize(
    "name, offset", [(n, 0.0) for n in BLOCKS] + [(n, 2.0**30) for n in NORMALIZED_ATTENTION_INPUT]
)
def test_block_bound_of_every_placement_is_above_the_300_bit_token_jacobians(name: str, offset: float) -> None:
    """Three tokens, random weights: the block bound is above every token-to-token Jacobian norm of the real
    block (a lower bound of its block-∞ norm), on ordinary inputs and, where the attention reads normalized
    inputs, on inputs at 2^30 (spread 2^8) whose float64 intermediates lose their low bits."""
    layer = _tiny_block(**BLOCKS[name])
    g = torch.Generator().manual_seed(8)
    x = offset + torch.randn(1, 3, 6, generator=g, dtype=F64) * (2.0**8 if offset else 1.0)
    bound = float(block_local_jacobian_upper_bound(x, layer)[0])
    lower = _mp_block_jacobian_lower_bound(x, layer)
    assert mpmath.mpf(bound) >= lower, (bound, float(lower))


def test_attention_reading_inputs_at_2_40_through_a_norm_is_refused_not_guessed() -> None:
    """At 2^40 (spread 2^14) float64 loses N₁(x) to about 10^-7: the softmax rows of the real N₁(x) are beyond the
    certified range, and the block bound says so instead of returning a number."""
    from attnsens.errors import InputError

    layer = _tiny_block("pre")
    g = torch.Generator().manual_seed(8)
    x = 2.0**40 + torch.randn(1, 3, 6, generator=g, dtype=F64) * 2.0**14
    with pytest.raises(InputError, match="input radius"):
        block_local_jacobian_upper_bound(x, layer)


def test_post_ln_block_bound_when_a_bias_of_2_60_rounds_the_residual_sum_is_not_below_the_real_norm() -> None:
    """A post-LN block whose attention adds b_O = 2^60: the real s₁ = 4x + b_O has 4x's spread (LayerNorm ignores
    the shift), but float64 rounds s₁ to multiples of 256 and widens its spread, so the point-evaluated ‖J_N₁(ŝ₁)‖
    is 14 % below the real one. The bound over s₁'s enclosure stays above the exact one-token norm."""
    import dataclasses

    d = 6
    layer = _tiny_block("post")
    eye = torch.eye(d, dtype=F64)
    attention = dataclasses.replace(
        layer.attention, w_q=torch.zeros(2, 3, d, dtype=F64), w_k=torch.zeros(2, 3, d, dtype=F64),
        w_v=eye.reshape(2, 3, d).clone(), w_o=3 * eye, b_q=None, b_k=None, b_v=None,
        b_o=torch.full((d,), 2.0**60, dtype=F64),
    )  # fmt: skip
    mlp = dataclasses.replace(layer.mlp, w_in=torch.zeros_like(layer.mlp.w_in), b_in=None, b_out=None)
    norm = NormWeights(kind="layernorm", gamma=torch.ones(d, dtype=F64), beta=None, eps=1e-5)
    layer = dataclasses.replace(layer, attention=attention, mlp=mlp, attn_norm=norm, mlp_norm=norm)
    x = torch.tensor([[[65.0, -65.0, 65.0, -65.0, 64.0, -64.0]]], dtype=F64)
    bound = float(block_local_jacobian_upper_bound(x, layer)[0])
    true = _mp_block_jacobian_lower_bound(x, layer)  # one token: the exact norm
    assert mpmath.mpf(bound) >= true, (bound, float(true))
    s1 = x + attention_sublayer(x, layer.attention)
    point = float(norm_jacobian_spectral_norm_upper_bound(s1, norm.gamma, norm.eps, norm.kind).amax())
    real = float(norm_jacobian_spectral_norm_upper_bound(4 * x, norm.gamma, norm.eps, norm.kind).amax())
    assert point < real / 1.1  # mutation: the factor at the float ŝ₁ is below the real one
