"""QK-norm (an RMSNorm of each head's query and key before RoPE, Qwen3 and Gemma 3, or after it, HunYuan) in the
attention bounds: dense Jacobians ≤ certified local bound ≤ Lipschitz bound, and the norm's Jacobian is not
optional."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry.attention import (
    AttentionBiases,
    _AttentionTensors,
    _mha_forward,
    apply_rotary,
    causal_mask,
    mha_forward,
    qk_norm_forward,
)
from attnsens.geometry.attention_bounds import (
    _mha_lipschitz_bounds,
    _mha_local_jacobian_bounds,
    _score_factors,
    mha_lipschitz_bounds,
    mha_local_jacobian_bounds,
    projection_norm_bounds,
)
from attnsens.geometry.estimates import block_jacobian_norm_estimate
from attnsens.geometry.norms import block_rms_norm
from attnsens.weights import AttentionWeights, NormWeights, RotaryConfig
from tests.reference.jacobian_oracles import block_inf_norm_lower_dense, block_inf_norm_scalar_tokens

F64 = torch.float64
ROPE = RotaryConfig(base=10.0, rotary_dim=4)


def _norm(d_head: int, seed: int, *, eps: float = 1e-6) -> NormWeights:
    g = torch.Generator().manual_seed(seed)
    gamma = torch.exp(torch.empty(d_head, dtype=F64).uniform_(-1.0, 1.0, generator=g))  # scales 0.37–2.7
    return NormWeights(kind="rmsnorm", gamma=gamma, beta=None, eps=eps)


def _instances(n: int, n_query: int, d_model: int, n_head: int, n_kv: int, d_head: int, seed: int) -> dict:
    """n random instances; the pre-norm scales spread over three decades (the norm removes them, so the
    rows' concentration comes from γ and τ, and the Jacobian's size from 1/r)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.empty(n, 1, 1, 1, dtype=F64).uniform_(-3.0, 1.5, generator=g))
    r = lambda *s: torch.randn(n, *s, generator=g, dtype=F64)  # noqa: E731
    return {
        "X": r(n_query, d_model), "Wq": r(n_head, d_head, d_model) * scale, "Wk": r(n_kv, d_head, d_model) * scale,
        "Wv": r(n_kv, d_head, d_model), "Wo": r(d_model, n_head * d_head), "bq": r(n_head, d_head) * scale[..., 0],
        "bk": r(n_kv, d_head) * scale[..., 0], "bv": r(n_kv, d_head), "bo": r(d_model),
    }  # fmt: skip


KEYS = ("X", "Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")


def _dense(inst: dict, *, tau: float, mask, rotary, q_norm, k_norm, after: bool = False) -> torch.Tensor:
    def f(X, Wq, Wk, Wv, Wo, bq, bk, bv, bo):
        biases = AttentionBiases(q=bq, k=bk, v=bv, o=bo)
        return _mha_forward(
            X[None],
            _AttentionTensors(
                Wq,
                Wk,
                Wv,
                Wo,
                tau=tau,
                mask=mask,
                biases=biases,
                rotary=rotary,
                q_norm=q_norm,
                k_norm=k_norm,
                qk_norm_after_rotary=after,
            ),
        ).output[0]

    return torch.func.vmap(torch.func.jacrev(f))(*(inst[k] for k in KEYS))


def _bounds(inst: dict, *, tau: float, mask, rotary, q_norm, k_norm, after: bool = False):
    biases = AttentionBiases(q=inst["bq"], k=inst["bk"], v=inst["bv"], o=inst["bo"])
    X, W = inst["X"], [inst[k] for k in ("Wq", "Wk", "Wv", "Wo")]
    norms = {"q_norm": q_norm, "k_norm": k_norm, "qk_norm_after_rotary": after}
    local = _mha_local_jacobian_bounds(
        X, _AttentionTensors(*W, tau=tau, mask=mask, biases=biases, rotary=rotary, **norms)
    )
    glob = _mha_lipschitz_bounds(
        _AttentionTensors(*W, tau=tau, biases=biases, rotary=rotary, **norms), radius_rms=block_rms_norm(X)
    )
    return local, glob


def _assert_dense_below_local_below_lipschitz(
    inst: dict, *, tau: float, mask, rotary, q_norm, k_norm, after: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense Jacobians' block-∞ lower bounds ≤ the local bound ≤ its paper form ≤ the Lipschitz bound's paper form,
    local ≤ Lipschitz, and the local bound within 4× of the dense one in the median; returns the dense Jacobians
    and their lower bounds."""
    norms = {"q_norm": q_norm, "k_norm": k_norm}
    dense = _dense(inst, tau=tau, mask=mask, rotary=rotary, after=after, **norms)
    lower = block_inf_norm_lower_dense(dense, iterations=30)
    local, glob = _bounds(inst, tau=tau, mask=mask, rotary=rotary, after=after, **norms)
    assert bool((lower <= local.upper_bound).all()), "an estimate exceeds the certified local bound"
    assert bool((local.upper_bound <= local.paper_form_upper_bound * (1 + 1e-12)).all())
    assert bool((local.paper_form_upper_bound <= glob.paper_form_upper_bound * (1 + 1e-12)).all())
    assert bool((local.upper_bound <= glob.upper_bound * (1 + 1e-12)).all())
    ratio = local.upper_bound / lower
    assert float(ratio.median()) < 4.0, f"local bound ÷ dense lower bound median {float(ratio.median()):.2f}"
    return dense, lower


@pytest.mark.parametrize(
    ("n_kv", "causal", "rotary", "sides"),
    [(2, False, None, "qk"), (1, True, ROPE, "qk"), (2, True, ROPE, "q"), (1, False, ROPE, "k")],
)
def test_dense_jacobian_below_local_below_lipschitz_under_qk_norm(n_kv, causal, rotary, sides) -> None:
    n, L, d_head, tau = 400, 4, 4, 0.7
    inst = _instances(n, L, 3, 2, n_kv, d_head, seed=11 + n_kv + 2 * causal)
    mask = causal_mask(L) if causal else None
    norms = {"q_norm": _norm(d_head, 1) if "q" in sides else None, "k_norm": _norm(d_head, 2) if "k" in sides else None}
    _assert_dense_below_local_below_lipschitz(inst, tau=tau, mask=mask, rotary=rotary, **norms)


def _shifted(norm: NormWeights, seed: int, size: float) -> NormWeights:
    """``norm`` with a beta ~ N(0, size²) per coordinate (a LayerNorm QK-norm read centred: N(a) + β)."""
    g = torch.Generator().manual_seed(seed)
    return dataclasses.replace(norm, beta=size * torch.randn(norm.gamma.shape, generator=g, dtype=F64))


@pytest.mark.parametrize(
    ("n_kv", "causal", "rotary", "sides", "tau", "size"),
    [(2, False, None, "qk", 0.7, 1.0), (1, True, ROPE, "qk", 0.05, 3.0), (2, True, ROPE, "q", 0.1, 3.0),
     (1, False, ROPE, "k", 0.05, 10.0)],
)  # fmt: skip
def test_dense_jacobian_below_local_below_lipschitz_under_qk_norm_with_beta(n_kv, causal, rotary, sides, tau, size):
    """q = R_t(N(a_t) + β): β leaves the Jacobian of N alone but moves every query or key, so the scores' size and,
    with τ down to 0.05, the rows' sharpness (‖q‖ up to γ_max √d_head + ‖β‖, β up to 10 per coordinate)."""
    n, L, d_head = 400, 4, 4
    inst = _instances(n, L, 3, 2, n_kv, d_head, seed=31 + n_kv + 2 * causal)
    mask = causal_mask(L) if causal else None
    norms = {
        "q_norm": _shifted(_norm(d_head, 1), 5, size) if "q" in sides else None,
        "k_norm": _shifted(_norm(d_head, 2), 6, size) if "k" in sides else None,
    }
    _assert_dense_below_local_below_lipschitz(inst, tau=tau, mask=mask, rotary=rotary, **norms)


def test_the_global_radii_of_a_qk_norm_with_beta_hold_the_forward_queries_and_keys() -> None:
    """‖R_t(N(a_t) + β)‖ ≤ the Lipschitz bound's query and key radii (γ_max √d_head + ‖β‖), whatever the input;
    with β large beside γ (10 per coordinate against γ ≤ 2.7) the radius without ‖β‖ falls below."""
    inst = _instances(50, 6, 3, 2, 2, 4, seed=17)
    q_norm, k_norm = _shifted(_norm(4, 1), 5, 10.0), _shifted(_norm(4, 2), 6, 10.0)
    biases = AttentionBiases(q=inst["bq"], k=inst["bk"], v=inst["bv"], o=inst["bo"])
    tensors = _AttentionTensors(
        inst["Wq"], inst["Wk"], inst["Wv"], inst["Wo"], tau=0.7, biases=biases, rotary=ROPE, q_norm=q_norm,
        k_norm=k_norm,
    )  # fmt: skip
    fwd = _mha_forward(inst["X"], tensors)
    norms = projection_norm_bounds(inst["Wq"], inst["Wk"], inst["Wv"], inst["Wo"], biases)
    factors = _score_factors(norms, torch.ones(50, dtype=F64), False, q_norm, k_norm, (1e-3, 1e-3), inst["Wq"],
                             inst["Wk"])  # fmt: skip
    largest_q = torch.linalg.vector_norm(fwd.queries, dim=-1).amax(dim=-1)  # [instance, head]
    largest_k = torch.linalg.vector_norm(fwd.keys, dim=-1).amax(dim=-1)
    assert bool((largest_q <= factors.q_radius).all()) and bool((largest_k <= factors.k_radius).all())
    plain = _score_factors(norms, torch.ones(50, dtype=F64), False, _norm(4, 1), _norm(4, 2), (1e-3, 1e-3),
                           inst["Wq"], inst["Wk"])  # fmt: skip
    assert bool((largest_q > plain.q_radius).any()) and bool((largest_k > plain.k_radius).any())


def test_a_beta_is_refused_on_a_joint_qk_norm_and_after_rope() -> None:
    inst = {k: v[0] for k, v in _instances(1, 5, 3, 2, 1, 4, seed=3).items()}
    w = {"w_q": inst["Wq"], "w_k": inst["Wk"], "w_v": inst["Wv"], "w_o": inst["Wo"], "tau": 2.0, "causal": True}
    with pytest.raises(ShapeError, match="a beta is supported on a per-head QK-norm"):
        AttentionWeights(**w, q_norm=_shifted(_norm(8, 1), 5, 1.0))
    with pytest.raises(ConfigError, match="QK-norms without beta only"):
        AttentionWeights(**w, rotary=ROPE, q_norm=_shifted(_norm(4, 1), 5, 1.0), qk_norm_after_rotary=True)


PARTIAL_ROPE = RotaryConfig(base=10.0, rotary_dim=4)
"""RoPE on 4 of 6 dimensions: the norm after it also reads two coordinates RoPE leaves alone."""


@pytest.mark.parametrize(
    ("n_kv", "causal", "d_head", "sides", "tau"),
    [(2, False, 4, "qk", 0.7), (1, True, 4, "qk", 0.05), (2, True, 6, "qk", 0.1), (2, True, 4, "q", 0.1),
     (1, False, 6, "k", 0.05)],
)  # fmt: skip
def test_dense_jacobian_below_local_below_lipschitz_under_qk_norm_after_rope(n_kv, causal, d_head, sides, tau) -> None:
    """HunYuan's q = N(R_t a_t), with γ far from constant on every rotating pair; τ down to 0.05 makes the rows
    sharp (the norm fixes the projections' scale, so τ and γ alone set how far the scores spread)."""
    n, L = 400, 5
    inst = _instances(n, L, 3, 2, n_kv, d_head, seed=61 + n_kv + 2 * causal + d_head)
    mask = causal_mask(L) if causal else None
    norms = {"q_norm": _norm(d_head, 1) if "q" in sides else None, "k_norm": _norm(d_head, 2) if "k" in sides else None}
    rotary = ROPE if d_head == 4 else PARTIAL_ROPE
    dense, lower = _assert_dense_below_local_below_lipschitz(
        inst, tau=tau, mask=mask, rotary=rotary, after=True, **norms
    )
    before = _dense(inst, tau=tau, mask=mask, rotary=rotary, **norms)
    assert not torch.allclose(before, dense), "the norm after RoPE must be another function than before it"
    misread, _ = _bounds(inst, tau=tau, mask=mask, rotary=rotary, **norms)  # the bound of the norm before RoPE
    assert bool((lower > misread.upper_bound).any()), "the instances must show that the order of the norm matters"


def test_qk_norm_after_rope_normalizes_the_rotated_projection_and_equals_before_for_gains_constant_on_pairs() -> None:
    inst = {k: v[0] for k, v in _instances(1, 5, 3, 2, 1, 4, seed=13).items()}
    q_norm, k_norm = _norm(4, 1), _norm(4, 2)
    tensors = (inst["Wq"], inst["Wk"], inst["Wv"], inst["Wo"])

    def forward(q_norm: NormWeights, k_norm: NormWeights, after: bool):
        return _mha_forward(
            inst["X"][None],
            _AttentionTensors(*tensors, tau=1.0, rotary=ROPE, q_norm=q_norm, k_norm=k_norm, qk_norm_after_rotary=after),
        )

    fwd = forward(q_norm, k_norm, True)
    rotated = apply_rotary(torch.einsum("hed,qd->hqe", inst["Wq"], inst["X"]), ROPE)
    torch.testing.assert_close(fwd.query_inputs[0], rotated)
    torch.testing.assert_close(fwd.queries[0], qk_norm_forward(rotated, q_norm))
    assert not torch.allclose(fwd.output, forward(q_norm, k_norm, False).output)
    paired = [dataclasses.replace(n, gamma=n.gamma[:2].repeat(2)) for n in (q_norm, k_norm)]  # γ_i = γ_{i+2}
    torch.testing.assert_close(forward(*paired, True).output, forward(*paired, False).output)


def test_qk_norm_after_rope_needs_a_rotary_a_norm_and_per_head_norms() -> None:
    inst = {k: v[0] for k, v in _instances(1, 5, 3, 2, 1, 4, seed=3).items()}
    weights = {"w_q": inst["Wq"], "w_k": inst["Wk"], "w_v": inst["Wv"], "w_o": inst["Wo"], "tau": 2.0, "causal": True}
    norms = {"q_norm": _norm(4, 1), "k_norm": _norm(4, 2)}
    after = AttentionWeights(**weights, rotary=ROPE, qk_norm_after_rotary=True, **norms)
    assert after.per_query_head().qk_norm_after_rotary
    with pytest.raises(ConfigError, match="needs a rotary"):
        AttentionWeights(**weights, qk_norm_after_rotary=True, **norms)
    with pytest.raises(ConfigError, match="needs a rotary"):
        AttentionWeights(**weights, rotary=ROPE, qk_norm_after_rotary=True)
    with pytest.raises(ConfigError, match="per-head QK-norms"):
        AttentionWeights(**weights, rotary=ROPE, qk_norm_after_rotary=True, q_norm=_norm(8, 1))


@pytest.mark.parametrize(("n_kv", "causal", "rotary"), [(2, False, None), (1, True, ROPE), (2, True, ROPE)])
def test_dense_jacobian_below_local_below_lipschitz_under_a_joint_qk_norm(n_kv, causal, rotary) -> None:
    """OLMo 2 normalizes all heads' queries (and all key heads' keys) at once, which couples the heads."""
    n, L, n_head, d_head, tau = 400, 4, 2, 4, 0.7
    inst = _instances(n, L, 3, n_head, n_kv, d_head, seed=41 + n_kv + 2 * causal)
    mask = causal_mask(L) if causal else None
    norms = {"q_norm": _norm(n_head * d_head, 7), "k_norm": _norm(n_kv * d_head, 8)}
    lower = block_inf_norm_lower_dense(_dense(inst, tau=tau, mask=mask, rotary=rotary, **norms), iterations=30)
    local, glob = _bounds(inst, tau=tau, mask=mask, rotary=rotary, **norms)
    assert bool((lower <= local.upper_bound).all()), "an estimate exceeds the certified local bound"
    assert bool((local.upper_bound <= local.paper_form_upper_bound * (1 + 1e-12)).all())
    assert bool((local.upper_bound <= glob.upper_bound * (1 + 1e-12)).all())
    ratio = local.upper_bound / lower
    assert float(ratio.median()) < 4.0, f"local bound ÷ dense lower bound median {float(ratio.median()):.2f}"
    per_head = {"q_norm": _norm(d_head, 7), "k_norm": _norm(d_head, 8)}
    separate = _mha_forward(
        inst["X"][:1], _AttentionTensors(*(inst[k][0] for k in ("Wq", "Wk", "Wv", "Wo")), tau=tau, **per_head)
    )
    joint = _mha_forward(
        inst["X"][:1], _AttentionTensors(*(inst[k][0] for k in ("Wq", "Wk", "Wv", "Wo")), tau=tau, **norms)
    )
    assert not torch.allclose(separate.output, joint.output), "the joint norm must differ from the per-head one"


def test_joint_qk_norm_forward_matches_a_norm_of_the_concatenated_projection() -> None:
    inst = {k: v[0] for k, v in _instances(1, 5, 3, 2, 1, 4, seed=9).items()}
    q_norm, k_norm = _norm(8, 1), _norm(4, 2)
    fwd = _mha_forward(
        inst["X"][None],
        _AttentionTensors(inst["Wq"], inst["Wk"], inst["Wv"], inst["Wo"], tau=1.0, q_norm=q_norm, k_norm=k_norm),
    )
    a = torch.einsum("hed,qd->qhe", inst["Wq"], inst["X"]).reshape(5, 8)
    expected = a / torch.sqrt(a.square().mean(dim=-1, keepdim=True) + q_norm.eps) * q_norm.gamma
    torch.testing.assert_close(fwd.queries[0].permute(1, 0, 2).reshape(5, 8), expected)
    keys = torch.einsum("hed,kd->khe", inst["Wk"], inst["X"]).reshape(5, 4)
    keys = keys / torch.sqrt(keys.square().mean(dim=-1, keepdim=True) + k_norm.eps) * k_norm.gamma
    for head in range(2):  # the one key head, repeated for both query heads
        torch.testing.assert_close(fwd.keys[0, head], keys)


def test_exact_norm_below_bound_for_scalar_tokens_under_qk_norm() -> None:
    """d_model = 1 makes the block-∞ norm an exact 2^L enumeration (tests/reference/jacobian_oracles.py)."""
    n, L, d_head, tau = 300, 5, 2, 0.5
    inst = _instances(n, L, 1, 3, 3, d_head, seed=7)
    norms = {"q_norm": _norm(d_head, 3), "k_norm": _norm(d_head, 4)}
    mask = causal_mask(L)
    exact = block_inf_norm_scalar_tokens(_dense(inst, tau=tau, mask=mask, rotary=None, **norms))
    local, _ = _bounds(inst, tau=tau, mask=mask, rotary=None, **norms)
    assert bool((exact <= local.upper_bound).all()), "an exact norm exceeds the certified local bound"


def test_ignoring_the_qk_norm_would_understate_the_jacobian() -> None:
    """Small pre-norm projections: the norm's 1/r amplifies the score sensitivity, and the bound follows it."""
    L, d, d_head, tau = 6, 4, 4, 1.0
    g = torch.Generator().manual_seed(5)
    Wq, Wk = (torch.randn(1, d_head, d, generator=g, dtype=F64) * 0.01 for _ in range(2))
    Wv, Wo = torch.randn(1, d_head, d, generator=g, dtype=F64), torch.randn(d, d_head, generator=g, dtype=F64)
    X = torch.randn(1, L, d, generator=g, dtype=F64)
    q_norm, k_norm = _norm(d_head, 5), _norm(d_head, 6)
    f = lambda Z: _mha_forward(Z, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, q_norm=q_norm, k_norm=k_norm)).output  # noqa: E731
    estimate = float(block_jacobian_norm_estimate(f, X, iterations=60, restarts=4)[0])
    bound = float(
        _mha_local_jacobian_bounds(
            X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, q_norm=q_norm, k_norm=k_norm)
        ).upper_bound[0]
    )
    without = float(_mha_local_jacobian_bounds(X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau)).upper_bound[0])
    assert estimate > without, "the instance must show that a bound without the norm's Jacobian fails"
    assert estimate <= bound


def test_weights_form_carries_the_qk_norm_and_refuses_a_wrong_width() -> None:
    inst = {k: v[0] for k, v in _instances(1, 5, 3, 2, 1, 4, seed=3).items()}
    norms = {"q_norm": _norm(4, 1), "k_norm": _norm(4, 2)}
    weights = AttentionWeights(
        w_q=inst["Wq"], w_k=inst["Wk"], w_v=inst["Wv"], w_o=inst["Wo"], tau=2.0, causal=True, rotary=ROPE, **norms
    )
    X = inst["X"][None]
    tensors = (inst["Wq"], inst["Wk"], inst["Wv"], inst["Wo"])
    expected = _mha_local_jacobian_bounds(
        X, _AttentionTensors(*tensors, tau=2.0, mask=causal_mask(5), rotary=ROPE, **norms)
    )
    assert torch.equal(mha_local_jacobian_bounds(X, weights).upper_bound, expected.upper_bound)
    lipschitz = _mha_lipschitz_bounds(_AttentionTensors(*tensors, tau=2.0, rotary=ROPE, **norms), radius_rms=2.0)
    assert torch.equal(mha_lipschitz_bounds(weights, radius_rms=2.0).upper_bound, lipschitz.upper_bound)
    per_head = weights.per_query_head()
    assert per_head.q_norm is weights.q_norm and per_head.k_norm is weights.k_norm
    with pytest.raises(ShapeError, match="q_norm must be an RMSNorm over one head's 4 coordinates or over all 2"):
        dataclasses.replace(weights, q_norm=_norm(3, 1))
    grouped = {k: v[0] for k, v in _instances(1, 5, 3, 4, 2, 4, seed=4).items()}  # 4 query heads, 2 key heads
    joint = AttentionWeights(
        w_q=grouped["Wq"], w_k=grouped["Wk"], w_v=grouped["Wv"], w_o=grouped["Wo"], tau=2.0, causal=True,
        q_norm=_norm(16, 1), k_norm=_norm(8, 2),
    )  # fmt: skip
    assert joint.per_query_head().k_norm.gamma.shape == (16,)  # each key head's γ, repeated for its query heads
    X = grouped["X"][None]
    torch.testing.assert_close(mha_forward(X, joint.per_query_head()).output, mha_forward(X, joint).output)
