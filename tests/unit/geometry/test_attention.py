"""Reference attention forward against a loop oracle: masks, biases, GQA, RoPE (docs/math.md §2.6)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attnsens.errors import InputError, ShapeError
from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, _mha_forward, apply_rotary, causal_mask
from attnsens.weights import AttentionWeights, RotaryConfig
from tests.reference.jacobian_oracles import attention_plain, rope_plain

F64 = torch.float64


def _weights(n_head: int, n_kv: int, d_head: int, d_model: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    return {
        "Wq": r(n_head, d_head, d_model), "Wk": r(n_kv, d_head, d_model), "Wv": r(n_kv, d_head, d_model),
        "Wo": r(d_model, n_head * d_head), "bq": r(n_head, d_head), "bk": r(n_kv, d_head), "bv": r(n_kv, d_head),
        "bo": r(d_model),
    }  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_head", "n_kv"), [(3, 3), (6, 2)])
@pytest.mark.parametrize("rope", [None, (100.0, 4, False), (50.0, 2, True)])
def test_forward_matches_loop_oracle(causal: bool, n_head: int, n_kv: int, rope: tuple | None) -> None:
    w = _weights(n_head, n_kv, 4, 7, seed=n_head + n_kv)
    X = torch.randn(2, 5, 7, dtype=F64)
    rotary = None if rope is None else RotaryConfig(base=rope[0], rotary_dim=rope[1], interleaved=rope[2])
    got = _mha_forward(
        X,
        _AttentionTensors(
            w["Wq"],
            w["Wk"],
            w["Wv"],
            w["Wo"],
            tau=1.7,
            mask=causal_mask(5) if causal else None,
            biases=AttentionBiases(q=w["bq"], k=w["bk"], v=w["bv"], o=w["bo"]),
            rotary=rotary,
        ),
    )
    for b in range(2):
        expected = attention_plain(
            X[b], w["Wq"], w["Wk"], w["Wv"], w["Wo"], tau=1.7, causal=causal,
            bq=w["bq"], bk=w["bk"], bv=w["bv"], bo=w["bo"], rope=rope,
        )  # fmt: skip
        assert_close(got.output[b], expected)
    assert_close(got.probabilities.sum(-1), torch.ones(2, n_head, 5, dtype=F64))


def test_gqa_equals_repeated_key_value_heads() -> None:
    w = _weights(6, 2, 3, 5, seed=1)
    weights = AttentionWeights(w_q=w["Wq"], w_k=w["Wk"], w_v=w["Wv"], w_o=w["Wo"], tau=2.0, causal=True)
    full = weights.per_query_head()
    X = torch.randn(1, 4, 5, dtype=F64)
    a = _mha_forward(X, _AttentionTensors(w["Wq"], w["Wk"], w["Wv"], w["Wo"], tau=2.0, mask=causal_mask(4))).output
    b = _mha_forward(X, _AttentionTensors(full.w_q, full.w_k, full.w_v, full.w_o, tau=2.0, mask=causal_mask(4))).output
    assert_close(a, b)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_is_an_orthogonal_map_per_position(interleaved: bool) -> None:
    rotary = RotaryConfig(base=10000.0, rotary_dim=6, interleaved=interleaved)
    x = torch.randn(11, 8, dtype=F64)
    rotated = apply_rotary(x, rotary)
    assert_close(rotated, rope_plain(x, 10000.0, 6, interleaved))
    assert_close(torch.linalg.vector_norm(rotated, dim=-1), torch.linalg.vector_norm(x, dim=-1))
    jac = torch.func.jacrev(lambda v: apply_rotary(v[None].expand(11, 8), rotary))(x[0])  # R_t for every t
    gram = torch.einsum("tij,tik->tjk", jac, jac)
    assert_close(gram, torch.eye(8, dtype=F64).expand(11, 8, 8))


def test_bad_masks_and_shapes_raise() -> None:
    w = _weights(2, 2, 3, 5, seed=0)
    X = torch.randn(1, 4, 5, dtype=F64)
    with pytest.raises(InputError):
        _mha_forward(
            X, _AttentionTensors(w["Wq"], w["Wk"], w["Wv"], w["Wo"], tau=1.0, mask=torch.zeros(4, 4, dtype=torch.bool))
        )
    with pytest.raises(ShapeError):
        _mha_forward(X[..., :4], _AttentionTensors(w["Wq"], w["Wk"], w["Wv"], w["Wo"], tau=1.0))


@pytest.mark.parametrize("local_attention", [2, 6, 7, 40])
def test_the_bidirectional_window_is_transformers_mask_for_modernberts_module_window(local_attention: int) -> None:
    """ModernBERT's sliding layers keep ``sliding_window`` = local_attention // 2 + 1 and run under transformers'
    bidirectional sliding-window mask (|i − j| ≤ local_attention // 2); ``window_mask`` of the module's window is
    that mask, key for key, and a window one wider or narrower is not (where either is shorter than the sequence)."""
    from transformers import ModernBertConfig
    from transformers.masking_utils import create_bidirectional_sliding_window_mask
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

    from attnsens.geometry.attention import window_mask

    n = 17
    config = ModernBertConfig(
        hidden_size=8, num_attention_heads=2, num_hidden_layers=2, local_attention=local_attention,
        layer_types=["full_attention", "sliding_attention"], attn_implementation="eager",
    )  # fmt: skip
    window = ModernBertAttention(config, layer_idx=1).sliding_window
    additive = create_bidirectional_sliding_window_mask(
        config=config, inputs_embeds=torch.zeros(1, n, 8), attention_mask=torch.ones(1, n, dtype=torch.long)
    )
    expected = (additive[0, 0] == 0) if additive is not None else torch.ones(n, n, dtype=torch.bool)
    assert torch.equal(window_mask(n, window=window), expected)
    assert int(expected.sum(dim=-1).max()) == min(n, 2 * (local_attention // 2) + 1)
    for wrong in (window - 1, window + 1):
        if wrong >= 1 and min(wrong, window) < n:  # windows of n keys or more all see the whole sequence
            assert not torch.equal(window_mask(n, window=wrong), expected)


def test_sliding_windows_of_either_direction_are_weights_and_a_window_below_one_key_is_refused() -> None:
    from attnsens.errors import ConfigError
    from attnsens.geometry.attention import attention_mask_of, window_mask

    w = _weights(2, 2, 3, 5, seed=0)
    weights = {"w_q": w["Wq"], "w_k": w["Wk"], "w_v": w["Wv"], "w_o": w["Wo"], "tau": 1.0}
    bidirectional = AttentionWeights(**weights, causal=False, sliding_window=2)
    assert torch.equal(attention_mask_of(bidirectional, 6), window_mask(6, window=2))
    causal = AttentionWeights(**weights, causal=True, sliding_window=2)
    assert torch.equal(attention_mask_of(causal, 6), causal_mask(6, window=2))
    assert attention_mask_of(AttentionWeights(**weights, causal=False), 6) is None
    with pytest.raises(ConfigError, match="at least 1"):
        AttentionWeights(**weights, causal=False, sliding_window=0)
