"""The recursion of docs/math.md §10.3 against a hand computation in plain floats on tiny diagonal weights.

Weights are diagonal so every spectral norm is read off by hand: with d_model = 2, one head, τ = 1,
W_Q = diag(.5, .25), W_K = diag(.4, .2) → G = diag(.2, .05), ‖G‖ = .2; b_Q = (1, 0) → g = W_Kᵀb_Q = (.4, 0);
W_V = diag(.3, .1), W_O = diag(2, 1) → OV = diag(.6, .1); MLP W₁ = [I; 0] (3×2), W₂ = [[.5,0,0],[0,.25,0]], ReLU
→ Λ = 1 + .5·1·1 = 1.5; b_V = (.1, 0), b_O = (0, .2) → c_O = (.2, .2), f(0) = c_O + W₂ relu(W₁ c_O) = (.3, .25).
Tokens (1,0), (0,1), (.6,.8): B_0 = 1, D_0 = √2.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnsens.influence import certified_constant
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights

EMBEDDING = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=torch.float64)


def t(values: list) -> torch.Tensor:
    """float64, so decimal weights are the hand values (float32 would shift them by ~1e-8)."""
    return torch.tensor(values, dtype=torch.float64)


def hand_layer(index: int, *, causal: bool = False) -> LayerWeights:
    attention = AttentionWeights(
        w_q=torch.diag(t([0.5, 0.25]))[None],
        w_k=torch.diag(t([0.4, 0.2]))[None],
        w_v=torch.diag(t([0.3, 0.1]))[None],
        w_o=torch.diag(t([2.0, 1.0])),
        b_q=t([[1.0, 0.0]]),
        b_k=t([[7.0, -3.0]]),  # a key bias shifts whole rows only: it must not change anything
        b_v=t([[0.1, 0.0]]),
        b_o=t([0.0, 0.2]),
        tau=1.0,
        causal=causal,
    )
    mlp = MLPWeights(
        kind="mlp",
        activation="relu",
        w_in=t([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]),
        w_out=t([[0.5, 0.0, 0.0], [0.0, 0.25, 0.0]]),
    )
    return LayerWeights(index=index, placement="none", attention=attention, mlp=mlp, attn_norm=None, mlp_norm=None)


def hand_step(state: dict, *, score=0.2, bias=0.4, value=0.6, offset=0.0, lipschitz=1.5, f0=math.hypot(0.3, 0.25)):
    """One block of docs/math.md §10.3 (unmasked, with the query-bias term ‖g‖), written out in plain floats."""
    b, d, e = state["B"], state["D"], state["E"]
    a = score * b**2 + bias * b
    rho = math.exp(2 * a)
    kappa = score * b
    k_in = kappa * (e + d) + bias * d
    k_out = (2 * kappa + bias) * e
    omega = 2 * (rho * k_in + k_out)
    f = value * (rho * d + e + omega * b)
    b_next = f0 + lipschitz * (b + value * b + offset)
    return {
        "B": b_next,
        "D": min(2 * b_next, lipschitz * (d + 2 * value * b)),
        "E": lipschitz * (e + f),
        "A": a,
    }


START = {"B": 1.0, "D": math.sqrt(2.0), "E": 0.0}


def test_one_layer_matches_hand_computation() -> None:
    cert = certified_constant([hand_layer(0)], token_embedding=EMBEDDING)
    expected = hand_step(START)
    (row,) = cert.layers
    assert cert.applicable and cert.masking == "unmasked"
    assert row.lipschitz == pytest.approx(1.5, rel=1e-8)
    assert row.f_zero_norm == pytest.approx(math.hypot(0.3, 0.25), rel=1e-8)
    assert row.hidden_norm_upper_bound == pytest.approx(expected["B"], rel=1e-8)
    assert row.score_upper_bound == pytest.approx(expected["A"], rel=1e-8)
    assert math.exp(row.log_changed_position) == pytest.approx(expected["D"], rel=1e-8)
    assert cert.log10_constant == pytest.approx(math.log10(expected["E"]), rel=1e-8)
    assert cert.influence_upper_bound(10) == pytest.approx(expected["E"] / 10, rel=1e-8)


def test_two_layers_exercise_the_other_positions_terms() -> None:
    cert = certified_constant([hand_layer(0), hand_layer(1)], token_embedding=EMBEDDING)
    expected = hand_step(hand_step(START))
    assert cert.layers[1].hidden_norm_upper_bound == pytest.approx(expected["B"], rel=1e-8)
    assert math.exp(cert.layers[1].log_changed_position) == pytest.approx(expected["D"], rel=1e-8)
    assert cert.log10_constant == pytest.approx(math.log10(expected["E"]), rel=1e-8)


def test_split_head_output_matches_hand_computation_and_is_looser() -> None:
    """§10.4 split form: V = W_V (‖·‖ = .3), offset ‖b_V‖ = .1, Λ = 1.5·max(1, ‖W_O‖ = 2) = 3, f(0) = (0, .25)."""
    split = dict(value=0.3, offset=0.1, lipschitz=3.0, f0=0.25)
    cert = certified_constant([hand_layer(0), hand_layer(1)], token_embedding=EMBEDDING, head_output="split")
    expected = hand_step(hand_step(START, **split), **split)
    assert cert.log10_constant == pytest.approx(math.log10(expected["E"]), rel=1e-8)
    ov = certified_constant([hand_layer(0), hand_layer(1)], token_embedding=EMBEDDING)
    assert ov.log10_constant < cert.log10_constant


def test_causal_variant_is_a_polynomial_in_the_harmonic_number() -> None:
    """Layer 2 of the causal variant: S = e^{2A} E_1 H, K^out = κE_1 + (κ + ‖g‖)S, E_2(H) = c_0 + c_1 H."""
    cert = certified_constant([hand_layer(0, causal=True), hand_layer(1, causal=True)], token_embedding=EMBEDDING)
    first = hand_step(START)  # E_0 = 0: the first block is the same as unmasked
    b, d, e, lam, score, bias, value = first["B"], first["D"], first["E"], 1.5, 0.2, 0.4, 0.6
    rho, kappa = math.exp(2 * (score * b**2 + bias * b)), score * b
    k_in = kappa * (e + d) + bias * d
    omega_0 = 2 * (rho * k_in + kappa * e)  # coefficient of H^0
    omega_1 = 2 * (kappa + bias) * rho * e  # coefficient of H^1
    c0 = lam * (e + value * (rho * d + omega_0 * b))
    c1 = lam * value * (rho * e + omega_1 * b)
    assert cert.masking == "causal"
    assert [math.exp(c) for c in cert.log_polynomial] == pytest.approx([c0, c1], rel=1e-8)
    n = 1000
    harmonic = sum(1 / r for r in range(1, n + 1))
    assert cert.influence_upper_bound(n) == pytest.approx((c0 + c1 * harmonic) / n, rel=1e-8)


def test_finite_length_tightening_matches_hand_computation() -> None:
    """At n: weight bound e^{2A}/(e^{2A} + n − 1) (ρ_n = n·that) and δ_j ≤ E/n in K^in."""
    n = 7
    cert = certified_constant([hand_layer(0), hand_layer(1)], token_embedding=EMBEDDING)
    state, score, bias, value, lam = dict(START), 0.2, 0.4, 0.6, 1.5
    for _ in range(2):
        b, d, e = state["B"], state["D"], state["E"]
        big = math.exp(2 * (score * b**2 + bias * b))
        rho = n * big / (big + n - 1)
        kappa = score * b
        k_in = kappa * (e / n + d) + bias * d
        omega = 2 * (rho * k_in + (2 * kappa + bias) * e)
        f = value * (rho * d + e + omega * b)
        b_next = math.hypot(0.3, 0.25) + lam * (b + value * b)
        state = {"B": b_next, "D": min(2 * b_next, lam * (d + 2 * value * b)), "E": lam * (e + f)}
    tightened = cert.influence_upper_bound(n, tightened=True)
    assert tightened == pytest.approx(state["E"] / n, rel=1e-8)
    assert tightened < cert.influence_upper_bound(n)


def test_key_bias_does_not_change_the_certificate() -> None:
    layers = [hand_layer(0), hand_layer(1)]
    without = [
        LayerWeights(
            index=layer.index,
            placement="none",
            attention=AttentionWeights(**{**layer.attention.__dict__, "b_k": None}),
            mlp=layer.mlp,
            attn_norm=None,
            mlp_norm=None,
        )
        for layer in layers
    ]
    with_bias = certified_constant(layers, token_embedding=EMBEDDING).log10_constant
    assert certified_constant(without, token_embedding=EMBEDDING).log10_constant == with_bias
