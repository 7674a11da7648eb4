"""xIELU (Apertus): the forward is transformers' module's, the derivative the hand-derived one on both sides of 0 and
of ε, and the slope and value bounds hold across the kink at ε and the jump at 0 (geometry/blocks.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from attnsens.errors import ConfigError
from attnsens.geometry.blocks import (
    ffn_lipschitz_upper_bound,
    ffn_local_jacobian_upper_bound,
    mlp_enclosure,
    xielu_jump,
    xielu_slope_upper_bound,
)
from attnsens.geometry.enclosures import Enclosure
from attnsens.geometry.estimates import block_jacobian_norm_estimate
from attnsens.geometry.layers import mlp_forward, synthetic_block_input, xielu_forward
from attnsens.models.hf import xielu_parameters
from attnsens.weights import MLPWeights, XIELUParameters
from tests.unit.geometry.tiny_layers import tiny_layers

F64 = torch.float64
P = XIELUParameters(alpha_p=0.8, alpha_n=0.7, beta=0.5, eps=-0.01)
"""ε widened from the default −10⁻⁶ so that the piece between ε and 0 is wide enough to sample; with α_n − β = 0.2
the slope there (−0.2) is smaller than β, the slope just right of 0, and than the slope just left of ε (0.493)."""
Q = replace(P, alpha_n=1.6)
"""The other way round: between ε and 0 the slope is β − α_n = −1.1, steeper than on either side of that piece."""


def _derivative(z: torch.Tensor, p: XIELUParameters) -> torch.Tensor:
    """f'(z) derived by hand from f: 2α_p z + β for z > 0; α_n(e^z − 1) + β for z < min(ε, 0), where min(z, ε) = z;
    β − α_n for ε < z ≤ 0, where min(z, ε) = ε is constant and only −α_n z + β z moves."""
    below_eps = torch.where(z < p.eps, p.alpha_n * torch.expm1(z) + p.beta, torch.full_like(z, p.beta - p.alpha_n))
    return torch.where(z > 0, 2 * p.alpha_p * z + p.beta, below_eps)


def _one_sided_slopes(p: XIELUParameters) -> dict[str, float]:
    return {
        "eps-": p.alpha_n * math.expm1(p.eps) + p.beta,
        "eps+": p.beta - p.alpha_n,
        "0-": p.beta - p.alpha_n,
        "0+": p.beta,
    }


def test_the_forward_is_transformers_xielu_with_the_parameters_read_from_its_module() -> None:
    from transformers.activations import XIELUActivation

    module = XIELUActivation(alpha_p_init=0.9, alpha_n_init=1.4, beta=0.3, eps=-1e-6, dtype=F64)
    read = xielu_parameters(module)
    assert (read.beta, read.eps) == (0.3, -1e-6)
    assert read.alpha_p == pytest.approx(0.9, rel=1e-12) and read.alpha_n == pytest.approx(1.4, rel=1e-12)
    z = torch.cat([torch.linspace(-30, 30, 20_001, dtype=F64), torch.tensor([-1e-6, -5e-7, 0.0, 1e-300], dtype=F64)])
    with torch.no_grad():
        torch.testing.assert_close(xielu_forward(z, read), module(z), rtol=0, atol=0)


def test_a_module_without_xielus_parameters_is_refused_by_name() -> None:
    from attnsens.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="SiLU is not transformers' xIELU"):
        xielu_parameters(torch.nn.SiLU())


def test_the_hand_derived_derivative_is_autograds_on_both_sides_of_zero_and_of_eps() -> None:
    points = [-6.0, -1.0, 2 * P.eps, P.eps - 1e-10, P.eps + 1e-10, P.eps / 2, -1e-10, 1e-10, 0.3, 2.5]
    z = torch.tensor(points, dtype=F64, requires_grad=True)
    (slope,) = torch.autograd.grad(xielu_forward(z, P).sum(), z)
    torch.testing.assert_close(_derivative(z.detach(), P), slope, rtol=1e-13, atol=1e-15)
    sides = _one_sided_slopes(P)
    torch.testing.assert_close(slope[[3, 4, 6, 7]], torch.tensor([sides[k] for k in sides], dtype=F64))
    # a kink at ε and, with ε < 0, a jump of α_n expm1(ε) at 0
    assert sides["eps-"] - sides["eps+"] == pytest.approx(P.alpha_n * math.exp(P.eps))
    zero = xielu_forward(torch.tensor([0.0, 1e-300], dtype=F64), P)
    assert float(zero[1] - zero[0]) == pytest.approx(-P.alpha_n * math.expm1(P.eps), rel=1e-15)
    assert xielu_jump(P) >= -P.alpha_n * math.expm1(P.eps)


@pytest.mark.parametrize("p", [P, Q], ids=["right-steeper", "left-steeper"])
@pytest.mark.parametrize(
    ("lower", "upper"),
    [(-5.0, -0.5), (-0.5, -0.005), (-0.02, -0.001), (-0.004, 1e-9), (-1e-9, 3.0), (0.1, 2.0), (-3.0, 3.0),
     (P.eps - 1e-9, P.eps + 1e-9), (-1e-12, 1e-12), (-0.0001, -0.00005)],
)  # fmt: skip
def test_the_slope_bound_covers_every_slope_of_its_interval_and_both_sides_of_each_kink(
    p: XIELUParameters, lower: float, upper: float
) -> None:
    z = torch.linspace(lower, upper, 100_001, dtype=F64)
    slopes = [_derivative(z, p).abs().max()]
    kinks = {p.eps: ("eps-", "eps+"), 0.0: ("0-", "0+")}
    sides = _one_sided_slopes(p)
    slopes += [abs(sides[side]) for kink, pair in kinks.items() if lower <= kink <= upper for side in pair]
    exact = max(float(s) for s in slopes)
    bound = float(xielu_slope_upper_bound(torch.tensor(lower, dtype=F64), torch.tensor(upper, dtype=F64), p))
    assert exact <= bound <= max(exact, abs(p.beta - p.alpha_n), abs(p.beta)) + 1e-12


@pytest.mark.parametrize(
    ("p", "centre", "other_side"),
    [(P, -1e-9, "0+"), (P, P.eps + 1e-9, "eps-"), (Q, 1e-9, "0-"), (Q, P.eps - 1e-9, "eps+")],
)
def test_a_slope_taken_at_the_centre_alone_misses_the_other_side_of_a_kink(
    p: XIELUParameters, centre: float, other_side: str
) -> None:
    """An interval of radius 2·10⁻⁹ around a point 10⁻⁹ from a kink holds the slope on the kink's other side: β = 0.5
    right of 0 or about 0.493 left of ε where the flat piece between them has −0.2 (P), and −1.1 on that piece
    beside 0.5 and 0.49 (Q). The bound must cover it; the slope at the centre does not."""
    z = torch.tensor([centre], dtype=F64)
    other = abs(_one_sided_slopes(p)[other_side])
    assert float(_derivative(z, p).abs()) < other
    assert float(xielu_slope_upper_bound(z - 2e-9, z + 2e-9, p)) >= other


def _one_unit(p: XIELUParameters) -> MLPWeights:
    one = torch.ones(1, 1, dtype=F64)
    return MLPWeights(kind="mlp", activation="xielu", w_in=one, w_out=one, xielu=p)


def test_the_enclosure_holds_across_the_jump_at_zero() -> None:
    """ẑ just below 0 and a real input just above it: the value moves by the jump α_n expm1(ε) ≈ 0.007, far more
    than the slope times the radius (~10⁻⁸), which is all a bound without the jump would allow."""
    mlp = _one_unit(P)
    x = torch.full((1, 1, 1), -1e-9, dtype=F64)
    enclosure = mlp_enclosure(Enclosure(x, torch.full((1, 1), 1e-8, dtype=F64)), mlp)
    for real in (-1.1e-8, -1e-9, 0.0, 5e-9, 9e-9):
        moved = mlp_forward(torch.full((1, 1, 1), real, dtype=F64), mlp)
        assert float((moved - enclosure.value).abs()) <= float(enclosure.radius)
    assert float(enclosure.radius) < 2 * xielu_jump(P)  # the jump, not a loose constant, is what it adds
    away = mlp_enclosure(Enclosure(x - 1.0, torch.full((1, 1), 1e-8, dtype=F64)), mlp)
    assert float(away.radius) < 1e-7  # no jump where the interval stays below 0


def test_mlp_bounds_hold_and_the_lipschitz_bound_is_infinite_where_xielu_jumps() -> None:
    mlp = replace(tiny_layers("pre", seed=3)[0].mlp, activation="xielu", xielu=P)
    radius_rms = 2.0
    X = synthetic_block_input(10, 9, batch=3, rms=radius_rms, seed=5)
    estimate = block_jacobian_norm_estimate(lambda z: mlp_forward(z, mlp), X, iterations=30)
    local = ffn_local_jacobian_upper_bound(X, mlp)
    assert bool((estimate <= local).all()), (estimate, local)
    assert math.isinf(float(ffn_lipschitz_upper_bound(mlp, radius_l2=radius_rms * math.sqrt(10))))
    continuous = replace(mlp, xielu=replace(P, eps=0.0))  # no jump: Lipschitz on the ball
    bound = ffn_lipschitz_upper_bound(continuous, radius_l2=radius_rms * math.sqrt(10))
    assert math.isfinite(float(bound)) and bool((ffn_local_jacobian_upper_bound(X, continuous) <= bound).all())
    X64 = X.to(F64)
    enclosure = mlp_enclosure(Enclosure(X64, torch.full(X64.shape[:-1], 0.05, dtype=F64)), mlp)
    shift = torch.randn(X64.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    moved = mlp_forward(X64 + 0.05 * shift / shift.norm(dim=-1, keepdim=True), mlp)
    assert bool(((moved - enclosure.value).norm(dim=-1) <= enclosure.radius).all())


def test_xielu_is_refused_without_a_radius_in_a_gate_or_without_its_parameters() -> None:
    mlp = replace(tiny_layers("pre", seed=3)[0].mlp, activation="xielu", xielu=P)
    with pytest.raises(ConfigError, match="only Lipschitz on a bounded set"):
        ffn_lipschitz_upper_bound(mlp)
    gated = replace(tiny_layers("pre", gated=True, seed=3)[0].mlp, activation="xielu", xielu=P)
    with pytest.raises(ConfigError, match="gated MLP with xielu"):
        ffn_local_jacobian_upper_bound(synthetic_block_input(10, 4, seed=1), gated)
    with pytest.raises(ConfigError, match="exactly when activation == 'xielu'"):
        replace(mlp, xielu=None)
    with pytest.raises(ConfigError, match="exactly when activation == 'xielu'"):
        replace(mlp, activation="gelu")
    with pytest.raises(ConfigError, match="alpha_n must be finite"):
        replace(P, alpha_n=math.nan)
