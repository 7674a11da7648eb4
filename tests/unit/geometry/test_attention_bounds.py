"""Soundness of the attention bounds: estimate ≤ certified local bound ≤ paper form ≤ global (docs/math.md T4, T5)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, _mha_forward, causal_mask, mha_forward
from attnsens.geometry.attention_bounds import (
    _mha_lipschitz_bounds,
    _mha_local_jacobian_bounds,
    mha_lipschitz_bounds,
    mha_local_jacobian_bounds,
)
from attnsens.geometry.estimates import block_jacobian_norm_estimate
from attnsens.geometry.norms import block_rms_norm
from attnsens.weights import RotaryConfig
from tests.helpers.attention_instances import F64, _instances
from tests.reference.jacobian_oracles import (
    block_inf_norm_lower_dense,
    block_inf_norm_scalar_tokens,
    block_inf_norm_single_input_token,
)

ROPE = RotaryConfig(base=10.0, rotary_dim=2)
YARN = RotaryConfig(base=10.0, rotary_dim=2, rope_type="yarn", factor=4.0, original_max_positions=3)


def _dense_jacobians(inst: dict, *, tau: float, mask, rotary) -> torch.Tensor:
    def f(X, Wq, Wk, Wv, Wo, bq, bk, bv, bo):
        biases = AttentionBiases(q=bq, k=bk, v=bv, o=bo)
        return _mha_forward(
            X[None], _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, mask=mask, biases=biases, rotary=rotary)
        ).output[0]

    keys = ("X", "Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
    return torch.func.vmap(torch.func.jacrev(f))(*(inst[k] for k in keys))


def _bounds(inst: dict, *, tau: float, mask, rotary):
    """Both bounds for all instances at once (weights batched along the instance axis)."""
    biases = AttentionBiases(q=inst["bq"], k=inst["bk"], v=inst["bv"], o=inst["bo"])
    X, W = inst["X"], [inst[k] for k in ("Wq", "Wk", "Wv", "Wo")]
    local = _mha_local_jacobian_bounds(X, _AttentionTensors(*W, tau=tau, mask=mask, biases=biases, rotary=rotary))
    radius = block_rms_norm(X)
    glob = _mha_lipschitz_bounds(_AttentionTensors(*W, tau=tau, biases=biases, rotary=rotary), radius_rms=radius)
    return local, glob


@pytest.mark.parametrize(
    ("n_kv", "causal", "rotary"),
    [(2, False, None), (1, True, None), (2, True, ROPE), (1, False, ROPE), (1, True, YARN)],
)
def test_estimate_below_local_below_paper_form_below_global_on_random_instances(n_kv, causal, rotary) -> None:
    n, L, tau = 1000, 4, 0.9
    inst = _instances(n, L, 3, 2, n_kv, 2, seed=n_kv + 2 * causal + 4 * (rotary is not None))
    mask = causal_mask(L) if causal else None
    lower = block_inf_norm_lower_dense(_dense_jacobians(inst, tau=tau, mask=mask, rotary=rotary), iterations=30)
    local, glob = _bounds(inst, tau=tau, mask=mask, rotary=rotary)
    assert bool((lower <= local.upper_bound).all()), "an estimate exceeds the certified local bound"
    assert bool((local.upper_bound <= local.paper_form_upper_bound * (1 + 1e-12)).all())
    assert bool((local.paper_form_upper_bound <= glob.paper_form_upper_bound * (1 + 1e-12)).all())
    assert bool((local.upper_bound <= glob.upper_bound * (1 + 1e-12)).all())
    assert float((local.theta_tilde < 0.9).to(F64).mean()) > 0.02, "instances must include concentrated heads"


def test_exact_norm_below_bound_for_scalar_tokens() -> None:
    """d_model = 1 makes the block-∞ norm an exact 2^L enumeration (tests/reference/jacobian_oracles.py)."""
    n, L, tau = 300, 5, 0.5
    inst = _instances(n, L, 1, 3, 3, 2, seed=7)
    mask = causal_mask(L)
    exact = block_inf_norm_scalar_tokens(_dense_jacobians(inst, tau=tau, mask=mask, rotary=None))
    local, _ = _bounds(inst, tau=tau, mask=mask, rotary=None)
    assert bool((exact <= local.upper_bound).all()), "an exact norm exceeds the certified local bound"


def test_bound_holds_at_inputs_found_by_gradient_ascent() -> None:
    """Maximize the Jacobian norm over X in the RMS ball, then check estimate ≤ local ≤ global there."""
    L, d, tau, radius = 5, 4, 1.0, 1.5
    for seed in range(3):
        inst = _instances(1, L, d, 2, 1, 3, seed=100 + seed)
        W = [inst[k][0] for k in ("Wq", "Wk", "Wv", "Wo")]
        biases = AttentionBiases(q=inst["bq"][0], k=inst["bk"][0], v=inst["bv"][0], o=inst["bo"][0])
        f = lambda Z: _mha_forward(Z, _AttentionTensors(*W, tau=tau, mask=causal_mask(L), biases=biases)).output  # noqa: B023,E731
        X = inst["X"].clone().requires_grad_(True)
        D = torch.randn(L, L, d, dtype=F64)  # probe i's direction for every input token
        for _ in range(20):
            D = (D / D.norm(dim=-1, keepdim=True).clamp_min(1e-30)).detach()  # keys a causal row never reads: 0
            J = torch.autograd.functional.jacobian(lambda Z: f(Z)[0], X, create_graph=True)[:, :, 0]  # noqa: B023
            images = torch.einsum("iokd,ikd->io", J, D)
            (grad_x,) = torch.autograd.grad(images.norm(dim=-1).amax(), X)
            with torch.no_grad():
                D = torch.einsum("iokd,io->ikd", J, images)  # block power step at the current X
                X += 0.2 * grad_x / grad_x.norm().clamp_min(1e-12)
                X *= torch.clamp(radius * math.sqrt(d) / X.norm(dim=-1, keepdim=True), max=1.0)
        X = X.detach()
        estimate = block_jacobian_norm_estimate(f, X, iterations=30, restarts=2)
        local = _mha_local_jacobian_bounds(X, _AttentionTensors(*W, tau=tau, mask=causal_mask(L), biases=biases))
        glob = _mha_lipschitz_bounds(_AttentionTensors(*W, tau=tau, biases=biases), radius_rms=radius)
        assert float(estimate[0]) <= float(local.upper_bound[0])
        assert float(local.upper_bound[0]) <= float(glob.upper_bound)


def test_rope_with_key_bias_needs_the_corrected_phi() -> None:
    """The key bias is irrelevant only without RoPE: the rotated bias R_j b_K varies with j (docs/math.md T4, §11)."""
    L, d, tau = 6, 2, 1.0
    Wq = torch.eye(2, dtype=F64)[None] * 3
    Wk = torch.eye(2, dtype=F64)[None] * 0.01
    Wv, Wo = torch.eye(2, dtype=F64)[None], torch.eye(2, dtype=F64)
    biases = AttentionBiases(k=torch.tensor([[4.0, 0.0]], dtype=F64))
    rotary = RotaryConfig(base=2.0, rotary_dim=2)
    X = torch.randn(1, L, d, dtype=F64)
    f = lambda Z: _mha_forward(Z, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, biases=biases, rotary=rotary)).output  # noqa: E731
    estimate = block_jacobian_norm_estimate(f, X, iterations=60, restarts=4)
    local = _mha_local_jacobian_bounds(X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, biases=biases, rotary=rotary))
    R = float(X.norm(dim=-1).amax())
    uncorrected_phi = 0.01 * 1.0 * R * (2 * 3 * R)  # ‖W_K‖‖W_V‖R(2‖W_Q‖R + ‖b_Q‖), b_Q = 0
    uncorrected = 1.0 * (1.0 + float(local.theta_tilde[0, 0]) * uncorrected_phi / tau)
    assert float(estimate[0]) > uncorrected, "the instance must show the uncorrected form failing"
    assert float(estimate[0]) <= float(local.upper_bound[0])


def test_single_token_closed_form() -> None:
    """L = 1: p = (1), θ = 0, and D MHA = W_O [W_V^1; …; W_V^H] exactly."""
    Wq, Wk, Wv = torch.randn(3, 2, 5, dtype=F64), torch.randn(3, 2, 5, dtype=F64), torch.randn(3, 2, 5, dtype=F64)
    Wo = torch.randn(5, 6, dtype=F64)
    X = torch.randn(1, 1, 5, dtype=F64) * 10
    local = _mha_local_jacobian_bounds(X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=0.3))
    assert_close(local.theta_tilde, torch.zeros(1, 3, dtype=F64))
    assert_close(local.sensitivity_term, torch.zeros(1, 3, dtype=F64))
    w_v = torch.linalg.matrix_norm(Wv, ord=2)
    assert_close(local.paper_form_upper_bound, torch.linalg.matrix_norm(Wo, ord=2) * w_v.sum()[None])
    exact = torch.linalg.matrix_norm(Wo @ Wv.reshape(6, 5), ord=2)
    J = torch.func.jacrev(lambda z: _mha_forward(z[None], _AttentionTensors(Wq, Wk, Wv, Wo, tau=0.3)).output[0])(X[0])
    assert_close(block_inf_norm_single_input_token(J), exact)
    estimate = block_jacobian_norm_estimate(
        lambda z: _mha_forward(z, _AttentionTensors(Wq, Wk, Wv, Wo, tau=0.3)).output, X, iterations=100
    )
    assert_close(estimate[0], exact)
    assert float(exact) <= float(local.upper_bound[0])


@pytest.mark.parametrize("n_query", [4, 5])
def test_uniform_attention_closed_form(n_query: int) -> None:
    """W_Q = 0: every row is uniform, θ̃ = 1 (even) or 1 − 1/n² (odd); Φ = 0 and D MHA = mean-mixing ⊗ W_O W_V."""
    Wq = torch.zeros(1, 2, 3, dtype=F64)
    Wk, Wv, Wo = torch.randn(1, 2, 3, dtype=F64), torch.randn(1, 2, 3, dtype=F64), torch.randn(3, 2, dtype=F64)
    X = torch.randn(1, n_query, 3, dtype=F64)
    local = _mha_local_jacobian_bounds(X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=1.0))
    theta = 1.0 if n_query % 2 == 0 else 1 - 1 / n_query**2
    assert_close(local.theta_tilde[0, 0], torch.tensor(theta, dtype=F64))
    assert_close(local.phi, torch.zeros(1, 1, dtype=F64))
    exact = torch.linalg.matrix_norm(Wo @ Wv[0], ord=2)  # all tokens moved along the top singular vector
    f = lambda Z: _mha_forward(Z, _AttentionTensors(Wq, Wk, Wv, Wo, tau=1.0)).output  # noqa: E731
    assert_close(block_jacobian_norm_estimate(f, X, iterations=100)[0], exact)
    assert float(exact) <= float(local.upper_bound[0])


def test_identity_weights_closed_form() -> None:
    """W_Q = W_K = W_V = W_O = I, one head: paper form = 1 + θ̃ · 2R²/τ."""
    eye = torch.eye(3, dtype=F64)
    X = torch.randn(2, 5, 3, dtype=F64)
    local = _mha_local_jacobian_bounds(
        X, _AttentionTensors(eye[None], eye[None], eye[None], eye, tau=2.0), geometry="l2"
    )
    R = X.norm(dim=-1).amax(dim=-1)
    assert_close(local.radius, R)
    assert_close(local.paper_form_upper_bound, 1 + local.theta_tilde[:, 0] * 2 * R**2 / 2.0)
    glob = _mha_lipschitz_bounds(_AttentionTensors(eye[None], eye[None], eye[None], eye, tau=2.0), radius_rms=1.0)
    assert_close(glob.paper_form_upper_bound, torch.tensor(1 + 2 * 3.0 / 2.0, dtype=F64))


def test_bad_arguments_raise() -> None:
    W, Wo = torch.randn(1, 2, 3, dtype=F64), torch.randn(3, 2, dtype=F64)
    with pytest.raises(ConfigError):
        _mha_local_jacobian_bounds(torch.randn(1, 2, 3), _AttentionTensors(W, W, W, Wo, tau=0.0))
    with pytest.raises(ShapeError):
        _mha_local_jacobian_bounds(torch.randn(1, 2, 3), _AttentionTensors(W, W, W, Wo.T, tau=1.0))
    with pytest.raises(ShapeError):
        _mha_lipschitz_bounds(_AttentionTensors(W[0], W[0], W[0], Wo, tau=1.0), radius_rms=1.0)


@pytest.mark.parametrize("window", [None, 2])
def test_attention_weights_give_the_numbers_of_their_tensors(window: int | None) -> None:
    """One AttentionWeights stands for its projections, τ, biases, rotary and causal (windowed) mask."""
    from dataclasses import replace

    from tests.unit.geometry.tiny_layers import tiny_layers

    attention = replace(tiny_layers(n_kv_head=1, rotary=True)[0].attention, sliding_window=window)
    X = torch.randn(2, 5, 10, generator=torch.Generator().manual_seed(3), dtype=F64)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    if window is not None:
        mask = mask & ~torch.ones(5, 5, dtype=torch.bool).tril(-window)
    tensors = (attention.w_q, attention.w_k, attention.w_v, attention.w_o)
    biases = AttentionBiases(q=attention.b_q, k=attention.b_k, v=attention.b_v, o=attention.b_o)
    keywords = {"tau": attention.tau, "biases": biases, "rotary": attention.rotary}

    assert_close(
        mha_forward(X, attention).output, _mha_forward(X, _AttentionTensors(*tensors, mask=mask, **keywords)).output
    )
    assert mha_forward(X.float(), attention).output.dtype == torch.float32  # cast to X's dtype
    local = mha_local_jacobian_bounds(X, attention, geometry="l2")
    expected = _mha_local_jacobian_bounds(X, _AttentionTensors(*tensors, mask=mask, **keywords), geometry="l2")
    assert_close(local.row_upper_bound, expected.row_upper_bound, rtol=0, atol=0)
    assert local.geometry == "l2"
    lipschitz = mha_lipschitz_bounds(attention, radius_rms=1.5)
    expected_lipschitz = _mha_lipschitz_bounds(_AttentionTensors(*tensors, **keywords), radius_rms=1.5)
    assert_close(lipschitz.upper_bound, expected_lipschitz.upper_bound, rtol=0, atol=0)


def test_key_sum_form_is_never_looser_than_the_theta_form_on_two_key_rows() -> None:
    """With two keys E_p‖v − y‖ = 2ε(1−ε)D ≤ θ · max_j ‖v_j − c‖ for every centre c (attention_terms), up to the
    certified terms' absolute radii."""
    from attnsens._rounding import norm2_upper_bound
    from attnsens.geometry import attention_accuracy as A
    from attnsens.geometry import attention_terms as T
    from attnsens.geometry.attention import expand_kv_heads
    from attnsens.geometry.attention_bounds import _output_accuracy, _side, projection_norm_bounds

    n, tau = 500, 0.7
    inst = _instances(n, 2, 3, 2, 1, 2, seed=11)
    biases = AttentionBiases(q=inst["bq"], k=inst["bk"], v=inst["bv"])
    X, Wq, Wk, Wv, Wo = (inst[k] for k in ("X", "Wq", "Wk", "Wv", "Wo"))
    fwd = _mha_forward(X, _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, biases=biases))
    allowed = fwd.allowed.expand_as(fwd.probabilities)
    batch = X.shape[0]
    norms = projection_norm_bounds(Wq, Wk, Wv, Wo, biases)
    w_norms = {k: getattr(norms, k).expand(batch, -1) for k in ("w_q", "w_k", "w_o_head")}
    query_side = _side(X, Wq, inst["bq"], None, None, None, w_norms["w_q"], 2)
    key_side = _side(X, Wk, inst["bk"], None, None, None, w_norms["w_k"], 2)
    gain_q, accuracy_q = query_side.gain, query_side.accuracy
    value_errors = T.value_errors(X, Wv, inst["bv"], 2)
    key_radius = T.KeyRadius(
        norm=A.row_max_of_keys(norm2_upper_bound(fwd.keys), allowed),
        error=A.row_max_of_keys(key_side.errors, allowed),
    )
    query_norms = T.query_functional_norms(fwd, key_side.gain, None, key_side.accuracy, query_side.errors)
    key_centre = expand_kv_heads(inst["bk"], 2, -2)[..., None, :].expand_as(fwd.queries)
    key_mean = fwd.probabilities @ fwd.keys
    spread = torch.minimum(
        T.score_spread(fwd, key_mean, gain_q, query_norms, allowed, None, accuracy_q, key_radius),
        T.score_spread(fwd, key_centre, gain_q, query_norms, allowed, None, accuracy_q, key_radius),
    )
    theta = 4 * fwd.probabilities[..., 0] * fwd.probabilities[..., 1]  # θ of a two-atom row
    output = _output_accuracy(Wo, 2, batch)
    outputs, distances, value_radius = T.projected_values(fwd, output, value_errors, w_norms["w_o_head"])
    output_spread = T.output_spread(outputs, distances, value_radius, output, inst["bv"], allowed)
    theta_form = theta / tau * spread * output_spread
    inputs = T.KeySumInputs(
        accuracy=accuracy_q, output=output, keys=key_radius, value_error_max=A.row_max_of_keys(value_errors, allowed),
        centres=(key_mean, key_centre), w_o_head=w_norms["w_o_head"],
    )  # fmt: skip
    key_sum_form = T.key_sum_sensitivity(fwd, distances, gain_q, query_norms, None, inputs) / tau
    # the forms' identity is exact; the certified values differ by their absolute radii (input errors, ≤ 1e-9 here)
    assert bool((key_sum_form <= theta_form * (1 + 1e-9) + 1e-9).all())
    assert float((key_sum_form < 0.9 * theta_form).to(F64).mean()) > 0.1, "the key-sum form should often win"
