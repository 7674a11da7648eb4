"""ALiBi (BLOOM: head h adds m_h·(j − i) to its scores) in the attention bounds: the bias is independent of the
input, so it moves the rows but no derivative; dense Jacobians ≤ certified local bound ≤ Lipschitz bound."""

from __future__ import annotations

import pytest
import torch

from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, _mha_forward, alibi_bias, causal_mask
from attnsens.geometry.attention_bounds import _mha_lipschitz_bounds, _mha_local_jacobian_bounds
from attnsens.geometry.norms import block_rms_norm
from tests.helpers.attention_instances import _instances
from tests.reference.jacobian_oracles import block_inf_norm_lower_dense

F64 = torch.float64
KEYS = ("X", "Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")


def _dense(inst: dict, *, tau: float, mask, slopes) -> torch.Tensor:
    def f(X, Wq, Wk, Wv, Wo, bq, bk, bv, bo):
        biases = AttentionBiases(q=bq, k=bk, v=bv, o=bo)
        return _mha_forward(
            X[None], _AttentionTensors(Wq, Wk, Wv, Wo, tau=tau, mask=mask, biases=biases, alibi_slopes=slopes)
        ).output[0]

    return torch.func.vmap(torch.func.jacrev(f))(*(inst[k] for k in KEYS))


def test_alibi_bias_is_the_row_shift_of_bloom_key_position_bias() -> None:
    slopes = torch.tensor([0.5, 0.0625], dtype=F64)
    relative = alibi_bias(slopes, 5)
    bloom = slopes[:, None, None] * torch.arange(5, dtype=F64)[None, None, :].expand(2, 5, 5)
    scores = torch.randn(2, 5, 5, dtype=F64)
    allowed = causal_mask(5)
    rows = [torch.softmax((scores + b).masked_fill(~allowed, -torch.inf), dim=-1) for b in (relative, bloom)]
    torch.testing.assert_close(rows[0], rows[1])


@pytest.mark.parametrize("steep", [False, True])
def test_dense_jacobian_below_local_below_lipschitz_under_alibi(steep: bool) -> None:
    n, L, tau = 500, 5, 0.9
    inst = _instances(n, L, 3, 2, 1, 2, seed=51 + steep)
    slopes = torch.tensor([4.0, 0.25] if steep else [0.5, 0.0625], dtype=F64)
    mask = causal_mask(L)
    lower = block_inf_norm_lower_dense(_dense(inst, tau=tau, mask=mask, slopes=slopes), iterations=30)
    biases = AttentionBiases(q=inst["bq"], k=inst["bk"], v=inst["bv"], o=inst["bo"])
    W = [inst[k] for k in ("Wq", "Wk", "Wv", "Wo")]
    local = _mha_local_jacobian_bounds(
        inst["X"], _AttentionTensors(*W, tau=tau, mask=mask, biases=biases, alibi_slopes=slopes)
    )
    plain = _mha_local_jacobian_bounds(inst["X"], _AttentionTensors(*W, tau=tau, mask=mask, biases=biases))
    glob = _mha_lipschitz_bounds(_AttentionTensors(*W, tau=tau, biases=biases), radius_rms=block_rms_norm(inst["X"]))
    assert bool((lower <= local.upper_bound).all()), "an estimate exceeds the certified local bound"
    assert bool((local.upper_bound <= glob.upper_bound * (1 + 1e-12)).all())
    assert not torch.equal(local.theta_tilde, plain.theta_tilde), "the bias must change the rows the bound reads"
    ratio = local.upper_bound / lower
    assert float(ratio.median()) < 2.0, f"local bound ÷ dense lower bound median {float(ratio.median()):.2f}"
