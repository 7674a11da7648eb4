"""Token-wise modules in slices of tokens: the audit's MLPs never hold a long input's [n, d_ff] activations at once."""

from __future__ import annotations

import pytest
import torch

import attnsens.capture as C
import attnsens.models as M
import attnsens.models.tokenwise as tokenwise
from attnsens.models.tokenwise import in_token_chunks
from attnsens.train.model import GPT, GPTConfig
from tests.unit.models.tiny_models import VOCAB, tiny_model

SLICED_FAMILIES = ("llama", "gpt2", "gpt_neox", "phi", "gptj", "distilbert", "own_gpt")
"""Families whose MLP is one module (``tokenwise_modules``), decoders with and without parallel blocks, an encoder
and attnsens' own GPT."""


def _model(family: str) -> torch.nn.Module:
    if family == "own_gpt":
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=3, d_model=21, max_positions=29)).eval()
    return tiny_model(family)


class _TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(4, 9), torch.nn.Linear(9, 3)
        self.widths: list[int] = []

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.widths.append(x.shape[-2])  # tokens
        return scale * self.down(torch.relu(self.up(x)))


def test_a_module_runs_on_slices_and_its_hooks_see_the_whole_call() -> None:
    module = _TwoLayer()
    x = torch.randn(2, 10, 4, generator=torch.Generator().manual_seed(0))
    whole = module(x)
    seen: list[torch.Size] = []
    module.register_forward_hook(lambda _m, _args, out: seen.append(out.shape))
    module.widths.clear()
    with torch.no_grad(), in_token_chunks([module], tokens=4):
        sliced = module(x)
        assert module.widths == [4, 4, 2]
        module.widths.clear()
        module(x, 2.0)  # another argument: the module's own call
        module(x[:, :4])  # no longer than a slice
        module(x[0])  # not [batch, n, d]
        assert module.widths == [10, 4, 10]
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-7)
    assert seen == [torch.Size([2, 10, 3])] * 2 + [torch.Size([2, 4, 3]), torch.Size([10, 3])]
    assert "forward" not in vars(module)  # the class's forward again


def test_an_output_that_is_not_the_tokens_runs_as_one_call_and_an_error_restores_the_module() -> None:
    class Pooling(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=1)

    pooling = Pooling()
    x = torch.randn(1, 9, 3, generator=torch.Generator().manual_seed(1))
    with in_token_chunks([pooling], tokens=4):
        torch.testing.assert_close(pooling(x), x.mean(dim=1))
    module = _TwoLayer()
    with pytest.raises(RuntimeError), in_token_chunks([module], tokens=4):
        module(torch.randn(1, 9, 5))  # wrong width: the Linear raises, the forward is restored
    assert "forward" not in vars(module)


@pytest.mark.parametrize("family", SLICED_FAMILIES)
def test_the_capture_runs_each_mlp_on_slices_of_tokens_with_the_same_rows(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = M.load(_model(family))
    mlps = adapter.tokenwise_modules()
    assert len(mlps) == adapter.spec.n_layer
    ids = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(2))
    widths: list[int] = []
    handles = [mlp.register_forward_pre_hook(lambda _m, args: widths.append(args[0].shape[1])) for mlp in mlps]
    # The first projection inside each MLP (a Linear, or GPT-2's Conv1D): negative widths tell its calls apart.
    inner = [next(child for child in mlp.children() if hasattr(child, "weight")) for mlp in mlps]
    handles += [part.register_forward_pre_hook(lambda _m, args: widths.append(-args[0].shape[-2])) for part in inner]
    try:
        whole = C.capture_row_statistics(adapter, ids)
        assert sorted(w for w in widths if w > 0) == [19] * len([w for w in widths if w > 0])
        widths.clear()
        monkeypatch.setattr(tokenwise, "TOKEN_CHUNK", 7)
        sliced = C.capture_row_statistics(adapter, ids)
    finally:
        for handle in handles:
            handle.remove()
    outer, slices = [w for w in widths if w > 0], [-w for w in widths if w < 0]
    assert outer and set(outer) == {19}  # each MLP is called once, with every token
    assert slices == [7, 7, 5] * len(outer)  # and runs on slices of 7
    assert all("forward" not in vars(mlp) for mlp in mlps)
    assert len(sliced) == len(whole)
    for a, b in zip(whole, sliced, strict=True):
        for name in ("p_max", "entropy", "theta_lower", "theta_upper"):
            torch.testing.assert_close(getattr(b.stats, name), getattr(a.stats, name), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ("bert", "opt", "bloom"))
def test_an_mlp_that_is_not_one_module_is_left_as_the_model_runs_it(family: str) -> None:
    model = tiny_model(family, attn_implementation="eager" if family == "bloom" else "sdpa")  # BLOOM has no sdpa
    assert M.load(model).tokenwise_modules() == []
