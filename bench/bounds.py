"""Benchmark: tightness of the certified attention bounds and the time to bound a whole model.

For each model, per layer: certified local bound / empirical estimate of the attention Jacobian's block-∞ norm
(the θ-aware bound, docs/math.md T4/T5; goal ≤ 10), beside the same ratio for the θ = 1 Lipschitz bound on the input
ball, for the paper-form local bound ‖W_O‖ Σ_h(‖W_V‖ + θ̃Φ/τ), and for the length-dependent product of norms
(θ replaced by n_keys/2). Then the time to compute every certified bound of the model (no estimates) beside the
time of one forward pass that captures the layer inputs (ratio). Models: attnsens' own tiny GPT (random init,
and trained for 200 steps on the default corpus), SmolLM2-135M (``attnsens.models.load("smollm2")``, skipped
if unavailable) and one tiny random-init transformers model per supported family (``family:<model_type>``:
2 layers, d_model 64, weights N(0, 1/fan_in), biases N(0, 0.1²), norm gains 1 + N(0, 0.1²); every model first
passes the weights-fidelity gate inside ``bound_model``). Appends one JSON line per model to
bench/results/bounds.jsonl.

    .venv/bin/python bench/bounds.py [--seq-len 32] [--queries 6] [--iterations 12] [--threads 1] [--models ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens import geometry as G
from attnsens.errors import InputError
from attnsens.geometry.attention import attention_mask_of, biases_of
from attnsens.provenance import provenance
from attnsens.study.bounds import bound_model

RESULTS = Path(__file__).resolve().parent / "results" / "bounds.jsonl"
TEXT = (
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven upon the place beneath. "
    "It is twice blest: it blesseth him that gives and him that takes. 'Tis mightiest in the mightiest; it "
    "becomes the throned monarch better than his crown. His sceptre shows the force of temporal power."
)


def tiny_gpt():
    from attnsens.models import load
    from attnsens.train.model import GPT, preset

    torch.manual_seed(0)
    return load(GPT(preset("tiny")))


def tiny_gpt_trained():
    """The tiny preset after 200 optimizer steps on the default corpus, with the run's own tokenizer."""
    import tempfile

    from tokenizers import Tokenizer

    from attnsens.models import load
    from attnsens.train.checkpoint import load_model_state
    from attnsens.train.model import GPT, preset
    from attnsens.train.run import default_data_config, preset_train_config, train

    torch.manual_seed(0)
    config = preset("tiny")
    with tempfile.TemporaryDirectory() as run_dir:
        result = train(config, preset_train_config("tiny", steps=200), default_data_config(config), run_dir,
                       device="cpu", write_log=False)  # fmt: skip
        model = GPT(config)
        model.load_state_dict(load_model_state(run_dir, result.final_step))
        tokenizer = Tokenizer.from_file(str(Path(run_dir) / "tokenizer.json"))
    return load(model.eval(), tokenizer=tokenizer)


def smollm2():
    from transformers.utils import logging as hf_logging

    from attnsens.models import load

    hf_logging.set_verbosity_error()
    return load("smollm2")


_DECODER = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
            "intermediate_size": 96, "max_position_embeddings": 64}  # fmt: skip
FAMILY_CONFIGS = {
    "gpt2": ("GPT2Config", "GPT2Model", {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 64}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", {"num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "hidden_size": 64, "intermediate_size": 96,
                                                   "max_position_embeddings": 64, "rotary_pct": 0.25}),
    "llama": ("LlamaConfig", "LlamaModel", {**_DECODER, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "mistral": ("MistralConfig", "MistralModel", {**_DECODER, "sliding_window": 16}),
    "qwen2": ("Qwen2Config", "Qwen2Model", _DECODER),
    "gemma": ("GemmaConfig", "GemmaModel", {**_DECODER, "head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3Model", {**_DECODER, "pad_token_id": 0}),
    "opt": ("OPTConfig", "OPTModel", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                                      "ffn_dim": 96, "max_position_embeddings": 64, "word_embed_proj_dim": 64}),
    "gptj": ("GPTJConfig", "GPTJModel", {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_inner": 96, "rotary_dim": 8,
                                         "n_positions": 64}),
    "roberta": ("RobertaConfig", "RobertaModel", {"num_hidden_layers": 2, "num_attention_heads": 4,
                                                  "hidden_size": 64, "intermediate_size": 96,
                                                  "max_position_embeddings": 66}),
    "bert": ("BertConfig", "BertModel", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                                         "intermediate_size": 96, "max_position_embeddings": 64}),
}  # fmt: skip
"""model_type → (config class, model class, keywords) of the tiny per-family models."""


def tiny_family(model_type: str):
    """A tiny random-init transformers model of ``model_type`` (module docstring), wrapped by attnsens."""
    import transformers
    from transformers.utils import logging as hf_logging

    from attnsens.models import load

    hf_logging.set_verbosity_error()
    config_name, model_name, keywords = FAMILY_CONFIGS[model_type]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**keywords, vocab_size=97, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed" in name or "wte" in name or "wpe" in name:
                continue
            if parameter.ndim == 2:
                parameter.normal_(0.0, parameter.shape[1] ** -0.5)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
            elif "norm" in name.lower() or "ln_" in name:
                # Gemma stores the gain as w in (1 + w), so a small w is a gain near 1 there too.
                offset = 0.0 if model_type == "gemma" else 1.0
                parameter.copy_(torch.randn_like(parameter) * 0.1 + offset)
    return load(model)


def certified_bounds_only(adapter, input_ids) -> float:
    """Seconds to compute every layer's local and global attention bounds and block bounds (no estimates)."""
    inputs = adapter.layer_inputs(input_ids)
    start = time.perf_counter()
    for layer, entry in zip(adapter.layers, inputs, strict=True):
        attn = layer.attention
        x = entry.attention_input.to(torch.float64)
        mask = attention_mask_of(attn, x.shape[1])
        G.mha_local_jacobian_upper_bound(x, attn.w_q, attn.w_k, attn.w_v, attn.w_o, tau=attn.tau, mask=mask,
                                         biases=biases_of(attn), rotary=attn.rotary)  # fmt: skip
        G.block_local_jacobian_upper_bound(entry.block_input, layer)
        if layer.placement == "pre":
            G.block_lipschitz_upper_bound(layer)
    return time.perf_counter() - start


def bench_model(name: str, adapter, args: argparse.Namespace) -> dict:
    try:
        input_ids = adapter.encode(TEXT, max_length=args.seq_len)
    except InputError:  # a random-init own GPT has no tokenizer: seeded random tokens
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(0, adapter.spec.vocab_size, (1, args.seq_len), generator=generator)
    start = time.perf_counter()
    adapter.layer_inputs(input_ids)
    forward_s = time.perf_counter() - start
    certified_bounds_only(adapter, input_ids)  # warm-up: compiled θ kernels, first-use initialisation
    bound_s = certified_bounds_only(adapter, input_ids)
    start = time.perf_counter()
    table = bound_model(adapter, input_ids, n_queries=args.queries, iterations=args.iterations,
                        compare_placements=False, model_name=name)  # fmt: skip
    full_s = time.perf_counter() - start
    layers = table[table["head"] == -1]
    estimate = layers["mha_jacobian_estimate"]
    ratios = {
        "theta_aware_local": (layers["mha_local_jacobian_upper_bound"] / estimate).tolist(),
        "paper_form_local": (layers["mha_local_paper_form_upper_bound"] / estimate).tolist(),
        "lipschitz_theta_1": (layers["mha_lipschitz_upper_bound"] / estimate).tolist(),
        "length_dependent_naive": (layers["mha_length_dependent_upper_bound"] / estimate).tolist(),
        "block_local": (layers["residual_jacobian_upper_bound"] / layers["block_jacobian_estimate"]).tolist(),
    }
    print(f"\n{name}: {len(layers)} layers, {input_ids.shape[1]} tokens")
    print(f"{'layer':>5} {'θ̃ max':>7} {'estimate':>9} {'local/est':>10} {'paper/est':>10} {'θ=1 Lip/est':>12} "
          f"{'naive/est':>10} {'block/est':>10}")  # fmt: skip
    for i, row in enumerate(layers.to_dict("records")):
        print(f"{row['layer']:>5} {row['theta_tilde']:>7.3f} {row['mha_jacobian_estimate']:>9.3g} "
              f"{ratios['theta_aware_local'][i]:>10.2f} {ratios['paper_form_local'][i]:>10.2f} "
              f"{ratios['lipschitz_theta_1'][i]:>12.2f} {ratios['length_dependent_naive'][i]:>10.2f} "
              f"{ratios['block_local'][i]:>10.3g}")  # fmt: skip
    medians = {k: statistics.median(v) for k, v in ratios.items()}
    within_goal = sum(r <= 10 for r in ratios["theta_aware_local"])
    print("median ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    worst = max(ratios["theta_aware_local"])
    print(f"θ-aware local bound / estimate: median {medians['theta_aware_local']:.2f}, worst {worst:.2f}; "
          f"within 10× in {within_goal}/{len(layers)} layers")  # fmt: skip
    print(f"time: certified bounds of all layers {bound_s:.3f} s vs one capturing forward {forward_s:.3f} s "
          f"(ratio {bound_s / forward_s:.1f}); full table with estimates {full_s:.1f} s")  # fmt: skip
    return {
        "model": name, "n_layer": len(layers), "seq_len": int(input_ids.shape[1]), "ratios": ratios,
        "median_ratios": medians, "worst_theta_aware_local": worst, "layers_within_goal": within_goal,
        "bound_seconds": bound_s,
        "forward_seconds": forward_s, "bound_over_forward": bound_s / forward_s, "table_seconds": full_s,
        "queries": args.queries, "iterations": args.iterations, "threads": torch.get_num_threads(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--queries", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models", default="all", help="comma-separated: tiny_gpt, tiny_gpt_trained, smollm2, family:<model_type>"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaders = {"tiny_gpt": tiny_gpt, "tiny_gpt_trained": tiny_gpt_trained, "smollm2": smollm2}
    loaders.update({f"family:{family}": lambda family=family: tiny_family(family) for family in FAMILY_CONFIGS})
    for name in list(loaders) if args.models == "all" else args.models.split(","):
        try:
            adapter = loaders[name]()
        except Exception as err:  # a missing optional model must not stop the other benchmark
            print(f"{name}: skipped ({type(err).__name__}: {err})")
            continue
        record = bench_model(name, adapter, args)
        append_record(RESULTS, {"bench": "bounds", **record, "provenance": provenance()})


if __name__ == "__main__":
    main()
