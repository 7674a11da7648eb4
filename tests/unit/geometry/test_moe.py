"""The mixture-of-experts Jacobian, its local bound with the router's choice certified, and the tie refusal
(docs/math.md T7, "Mixtures of experts")."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from attnsens.errors import ConfigError, RouterTieError
from attnsens.geometry.blocks import (
    ffn_lipschitz_upper_bound,
    ffn_token_jacobian_upper_bound,
    mlp_enclosure,
    moe_certified_routing,
    moe_token_jacobian_upper_bound,
)
from attnsens.geometry.enclosures import exact
from attnsens.geometry.layers import mlp_forward, moe_forward, moe_routing
from attnsens.weights import MLPWeights, MoEGateMode, MoEWeights

F64 = torch.float64
D_MODEL, D_FF, EXPERTS = 6, 5, 4


def _expert(generator: torch.Generator) -> MLPWeights:
    def w(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=F64) / math.sqrt(shape[-1])

    return MLPWeights(kind="gated", activation="silu", w_gate=w(D_FF, D_MODEL), w_in=w(D_FF, D_MODEL),
                      w_out=w(D_MODEL, D_FF))  # fmt: skip


def _moe(mode: MoEGateMode, *, shared: bool = False, seed: int = 0, router_scale: float = 1.0) -> MoEWeights:
    generator = torch.Generator().manual_seed(seed)
    return MoEWeights(
        router=router_scale * torch.randn(EXPERTS, D_MODEL, generator=generator, dtype=F64),
        experts=tuple(_expert(generator) for _ in range(EXPERTS)),
        top_k=2,
        gate_mode=mode,
        shared=_expert(generator) if shared else None,
        shared_gate=torch.randn(D_MODEL, generator=generator, dtype=F64) if shared else None,
    )


def _tokens(n: int, seed: int = 1) -> Tensor:
    return 2.0 * torch.randn(1, n, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _jacobian(moe: MoEWeights, x: Tensor) -> Tensor:
    """Autograd's Jacobian [d_model, d_model] of the reference forward at one token ``x`` [d_model]."""
    return torch.autograd.functional.jacobian(lambda z: moe_forward(z, moe), x)


def _formula_jacobian(moe: MoEWeights, x: Tensor, *, gate_motion: bool = True) -> Tensor:
    """Σ_{e∈S} g_e J_{E_e} + Σ_{e∈S} E_e ∇g_eᵀ at one token, with ∇g_e = Σ_{f∈P} q_e(δ_ef − q_f) w_f over the
    softmax's pool P (docs/math.md T7); ``gate_motion=False`` drops the second sum."""
    logits, selected, gates = moe_routing(x, moe)
    pool = selected if moe.gate_mode == "topk_softmax" else torch.arange(moe.n_expert)
    q = torch.softmax(logits[pool], dim=-1)
    jacobian = torch.zeros(D_MODEL, D_MODEL, dtype=F64)
    for gate, e in zip(gates, selected.tolist(), strict=True):
        expert = moe.experts[e]
        jacobian += gate * torch.autograd.functional.jacobian(lambda z, expert=expert: mlp_forward(z, expert), x)
        if gate_motion:
            position = int((pool == e).nonzero())
            gradient = q[position] * (moe.router[e] - q @ moe.router[pool])
            jacobian += torch.outer(mlp_forward(x, expert), gradient)
    return jacobian


@pytest.mark.parametrize("mode", ["softmax", "topk_softmax"])
def test_the_jacobian_formula_with_the_gates_motion_is_autograds(mode: MoEGateMode) -> None:
    moe, x = _moe(mode), _tokens(6)
    for token in x[0]:
        torch.testing.assert_close(_formula_jacobian(moe, token), _jacobian(moe, token), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["softmax", "topk_softmax"])
def test_the_formula_without_the_gates_motion_is_not_the_jacobian(mode: MoEGateMode) -> None:
    """The gate weights move with x even where S does not: dropping Σ E_e ∇g_eᵀ misses a term of the Jacobian."""
    moe, x = _moe(mode), _tokens(6)
    misses = [
        float(torch.linalg.matrix_norm(_formula_jacobian(moe, t, gate_motion=False) - _jacobian(moe, t)))
        / float(torch.linalg.matrix_norm(_jacobian(moe, t)))
        for t in x[0]
    ]
    assert min(misses) > 1e-3, misses


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("mode", ["softmax", "topk_softmax"])
def test_the_local_bound_holds_at_every_token(mode: MoEGateMode, shared: bool) -> None:
    moe, x = _moe(mode, shared=shared, seed=2), _tokens(12, seed=3)
    bound = moe_token_jacobian_upper_bound(x, moe)
    norms = torch.stack([torch.linalg.matrix_norm(_jacobian(moe, t), 2) for t in x[0]])
    assert bool((norms <= bound[0]).all()), (norms, bound)
    assert bool((bound[0] <= 20 * norms).all()), bound[0] / norms  # measured up to 7.5 here
    torch.testing.assert_close(ffn_token_jacobian_upper_bound(x, moe), bound, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["softmax", "topk_softmax"])
def test_the_bound_over_a_ball_holds_at_points_of_the_ball(mode: MoEGateMode) -> None:
    """With an input radius δ the bound covers every input within δ: the routing is certified on the whole ball
    and the gates, the experts' Jacobians and outputs are bounded over it."""
    moe, x = _moe(mode, shared=True, seed=4), _tokens(8, seed=5)
    radius = torch.full((1, 8), 0.01, dtype=F64)
    bound = moe_token_jacobian_upper_bound(x, moe, input_radius=radius)
    assert bool((bound >= moe_token_jacobian_upper_bound(x, moe)).all())
    generator = torch.Generator().manual_seed(6)
    for _ in range(5):
        shift = torch.randn(x.shape, generator=generator, dtype=F64)
        moved = x + 0.01 * shift / shift.norm(dim=-1, keepdim=True)
        assert bool((moe_routing(moved, moe)[1].sort().values == moe_routing(x, moe)[1].sort().values).all())
        norms = torch.stack([torch.linalg.matrix_norm(_jacobian(moe, t), 2) for t in moved[0]])
        assert bool((norms <= bound[0]).all())


def test_the_gate_bounds_cover_the_gates_over_the_ball() -> None:
    moe, x = _moe("softmax", seed=7), _tokens(8, seed=8)
    routing = moe_certified_routing(x, moe, input_radius=torch.full((1, 8), 0.01, dtype=F64))
    _, selected, gates = moe_routing(x, moe)
    assert torch.equal(routing.selected, selected)
    assert bool((routing.gate_upper <= 1.0).all())
    generator = torch.Generator().manual_seed(9)
    for _ in range(5):
        shift = torch.randn(x.shape, generator=generator, dtype=F64)
        _, moved_selected, moved_gates = moe_routing(x + 0.01 * shift / shift.norm(dim=-1, keepdim=True), moe)
        assert torch.equal(moved_selected, selected) and bool((moved_gates <= routing.gate_upper).all())
    assert float((routing.gate_upper - gates).amax()) < 0.1  # not a vacuous bound


def test_a_router_tie_is_refused_naming_the_token_and_the_experts() -> None:
    """Experts 1 and 2 share a router row: their logits tie at every input, and with top_k = 2 (expert 0 first)
    the second choice is not certified."""
    moe = _moe("topk_softmax", seed=9)
    router = moe.router.clone()
    router[2] = router[1]
    router[0] = 10 * router[1]  # expert 0 first wherever expert 1's logit is positive
    tied = replace(moe, router=router)
    x = _tokens(4, seed=10)
    x = torch.where((x @ router[1] > 0)[..., None], x, -x)  # expert 1's logit positive at every token
    named = r"router tie at token 0 of sequence 0: the logits of experts [12] \(the last of its top 2\) and [12]"
    with pytest.raises(RouterTieError, match=named):
        moe_token_jacobian_upper_bound(x, tied)
    apart = replace(tied, top_k=1)  # the first choice is certified
    assert bool(torch.isfinite(moe_token_jacobian_upper_bound(x, apart)).all())


def test_a_near_tie_within_the_input_radius_is_refused() -> None:
    moe, x = _moe("topk_softmax", seed=11), _tokens(4, seed=12)
    logits = moe_routing(x, moe)[0].sort(dim=-1, descending=True).values
    gap = float((logits[..., 1] - logits[..., 2]).amin())
    spread = float(torch.linalg.matrix_norm(moe.router, 2))
    moe_token_jacobian_upper_bound(x, moe, input_radius=torch.full((1, 4), gap / (4 * spread), dtype=F64))
    with pytest.raises(RouterTieError, match="router tie"):
        moe_token_jacobian_upper_bound(x, moe, input_radius=torch.full((1, 4), 2 * gap, dtype=F64))


def test_a_mixture_has_no_lipschitz_constant_and_no_output_enclosure() -> None:
    moe = _moe("softmax")
    assert math.isinf(float(ffn_lipschitz_upper_bound(moe, radius_l2=3.0)))
    with pytest.raises(ConfigError, match="mixture of experts is not enclosed"):
        mlp_enclosure(exact(_tokens(2)), moe)


def test_the_forward_is_the_sum_over_the_selected_experts_token_by_token() -> None:
    moe, x = _moe("softmax", shared=True), _tokens(5)
    for token, out in zip(x[0], moe_forward(x, moe)[0], strict=True):
        logits = token @ moe.router.T
        chosen = logits.topk(2).indices
        p = torch.softmax(logits, dim=-1)
        expected = sum(p[e] * mlp_forward(token, moe.experts[e]) for e in chosen.tolist())
        assert moe.shared is not None and moe.shared_gate is not None
        expected = expected + torch.sigmoid(token @ moe.shared_gate) * mlp_forward(token, moe.shared)
        torch.testing.assert_close(out, expected)


def test_moe_weights_refuse_inconsistent_shapes() -> None:
    moe = _moe("softmax")
    with pytest.raises(ConfigError, match="top_k must lie in"):
        replace(moe, top_k=5)
    with pytest.raises(ConfigError, match="gate_mode"):
        replace(moe, gate_mode="sigmoid")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="shared and shared_gate"):
        replace(moe, shared=moe.experts[0])
