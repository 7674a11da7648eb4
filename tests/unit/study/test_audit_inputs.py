"""What ``audit`` accepts: lists of texts (padded, mask honoured), [batch, n] ids with an attention_mask (padded
rows never audited), and text windows that are each a well-formed model input ([CLS] … [SEP] for BERT)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

import attnsens.models as M
from attnsens.capture import RowSelection
from attnsens.errors import InputError
from attnsens.models.loading import _minilm_source
from attnsens.study.auditing import audit
from attnsens.study.inputs import model_inputs
from tests.unit.models.tiny_models import VOCAB, eager_attentions, spread_weights, tiny_model

TEXTS = ["To be, or not to be", "that is the question: whether 'tis nobler in the mind to suffer", "Ay"]


@pytest.fixture(scope="module")
def tiny_bert() -> M.ModelAdapter:
    """A 2-layer random BERT with the vocabulary and tokenizer of all-MiniLM-L6-v2 (shipped as a package)."""
    tokenizer = AutoTokenizer.from_pretrained(_minilm_source()[0])
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, num_hidden_layers=2, num_attention_heads=3,
                        hidden_size=21, intermediate_size=37, max_position_embeddings=41)  # fmt: skip
    model = BertModel(config, add_pooling_layer=False)
    spread_weights(model)
    return M.load(model.eval(), tokenizer=tokenizer)


def _p_max(result, batch: int) -> torch.Tensor:
    rows = result.rows[result.rows["batch"] == batch].sort_values(["layer", "head", "query"])
    return torch.tensor(rows["p_max"].to_numpy())


def test_a_list_of_texts_is_padded_and_each_text_audited_as_if_alone(tiny_bert: M.ModelAdapter) -> None:
    together = audit(tiny_bert, TEXTS)
    for batch, text in enumerate(TEXTS):
        n = tiny_bert.encode(text).shape[1]
        mine = together.rows[together.rows["batch"] == batch]
        assert len(mine) == 2 * 3 * n and int(mine["query"].max()) == n - 1  # no padded row audited
        assert (mine["n_keys"] == n).all()  # padded keys are not attended to
        alone = audit(tiny_bert, text)
        torch.testing.assert_close(_p_max(together, batch), _p_max(alone, 0), rtol=1e-5, atol=1e-6)


def test_text_windows_are_well_formed_model_inputs(tiny_bert: M.ModelAdapter) -> None:
    tokenizer = tiny_bert.tokenizer
    ids, mask = model_inputs(tiny_bert, " ".join(TEXTS * 3), seq_len=9)
    assert mask is None and ids.shape[1] == 9 and ids.shape[0] >= 3
    assert (ids[:, 0] == tokenizer.cls_token_id).all() and (ids[:, -1] == tokenizer.sep_token_id).all()
    stream = tiny_bert.encode(" ".join(TEXTS * 3), special_tokens=False)[0]
    assert torch.equal(ids[:, 1:-1].reshape(-1), stream[: ids.shape[0] * 7])  # consecutive text, nothing lost


def test_ids_with_a_left_padding_mask_match_eager_on_the_real_rows_only() -> None:
    model = tiny_model("llama")
    ids = torch.randint(2, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0
    result = audit(model, ids, attention_mask=mask)
    padded = result.rows[result.rows["batch"] == 1]
    assert len(padded) == 2 * 6 * 7 and int(padded["query"].min()) == 4
    assert padded["n_keys"].tolist() == [q - 3 for q in padded["query"]]  # padded keys excluded
    reference = eager_attentions(model, ids, attention_mask=mask)
    for row in padded.itertuples():
        expected = reference[row.layer][1, row.head, row.query].max()
        assert abs(row.p_max - float(expected)) <= 1e-5


def test_padding_is_checked_and_combined_only_where_it_means_something(tiny_bert: M.ModelAdapter) -> None:
    ids = torch.randint(2, VOCAB, (2, 7))
    holes = torch.tensor([[1, 1, 0, 1, 1, 1, 1], [1] * 7])
    with pytest.raises(InputError, match="contiguous"):
        audit(tiny_model("llama"), ids, attention_mask=holes)
    with pytest.raises(InputError, match="all padding"):
        audit(tiny_model("llama"), ids, attention_mask=torch.tensor([[0] * 7, [1] * 7]))
    with pytest.raises(InputError, match="must equal"):
        audit(tiny_model("llama"), ids, attention_mask=torch.ones(2, 6))
    with pytest.raises(InputError, match="drop attention_mask and seq_len"):
        audit(tiny_bert, TEXTS, seq_len=5)
    with pytest.raises(InputError, match="no real token"):
        audit(tiny_model("llama"), ids, attention_mask=torch.tensor([[0] * 5 + [1] * 2, [1] * 7]),
              selection=RowSelection(query_stop=4))  # fmt: skip
