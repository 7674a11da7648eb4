"""Benchmark: tightness of the certified attention bounds and the time to bound a whole model.

For each model, per layer: certified local bound / empirical estimate of the attention Jacobian's block-∞ norm
(the θ-aware bound, docs/math.md T4/T5; goal ≤ 10), beside the same ratio for the θ = 1 Lipschitz bound on the input
ball, for the paper-form local bound ‖W_O‖ Σ_h(‖W_V‖ + θ̃Φ/τ), and for the length-dependent product of norms
(θ replaced by n_keys/2). Then, per layer, the time of that layer inside the model's plain forward pass (median of
5), of its certified bounds alone and of its full ``bound_model`` records with estimates, each as a ratio to the
plain layer measured in the same run (weight norms computed afresh in each, as in a new process); and the totals
beside one forward pass that captures the layer inputs.
Models: attnsens' own tiny GPT (random init, and trained for 200 steps on the default corpus), SmolLM2-135M and all-
MiniLM-L6-v2 (``attnsens.models.load("smollm2")``, ``"minilm"``, skipped if unavailable) and one tiny random-init
transformers model per supported family (``family:<model_type>``: 2 layers, d_model 64, weights N(0, 1/fan_in),
biases N(0, 0.1²), norm gains 1 + N(0, 0.1²); every model first passes the weights-fidelity gate inside
``bound_model``). Appends one JSON line per model to bench/results/bounds.jsonl.

    .venv/bin/python bench/bounds.py [--seq-len 32] [--queries 6] [--iterations 12] [--threads 1] [--models ...]

``--against REV`` measures instead the cost of a change: the certified bounds of every layer (as above, weight norms
computed afresh), timed in this tree and in a checkout of the git revision REV (a temporary worktree, run in a
subprocess on the same models and inputs), alternating for ``--rounds`` rounds, and prints this tree ÷ REV.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens import _rounding as rounding
from attnsens import geometry as G
from attnsens.errors import InputError
from attnsens.models.fidelity import probe_input_ids
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


def packaged(alias: str):
    """A model shipped as a package (``smollm2``, ``minilm``), through ``attnsens.models.load``."""
    from transformers.utils import logging as hf_logging

    from attnsens.models import load

    hf_logging.set_verbosity_error()
    return load(alias)


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
    "qwen3": ("Qwen3Config", "Qwen3Model", {**_DECODER, "head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaModel", {**_DECODER, "head_dim": 16}),
    # Sandwich norms and the attention logit softcap of the released checkpoints (50).
    "gemma2": ("Gemma2Config", "Gemma2Model", {**_DECODER, "head_dim": 16, "query_pre_attn_scalar": 16,
                                               "sliding_window": 16, "attn_logit_softcapping": 50.0}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3TextModel", {**_DECODER, "head_dim": 16, "query_pre_attn_scalar": 16,
                                                           "sliding_window": 16,
                                                           "layer_types": ["sliding_attention", "full_attention"]}),
    "olmo2": ("Olmo2Config", "Olmo2Model", {**_DECODER, "pad_token_id": 0}),
    "bloom": ("BloomConfig", "BloomModel", {"n_layer": 2, "n_head": 4, "hidden_size": 64}),
    "phi": ("PhiConfig", "PhiModel", {**_DECODER, "num_key_value_heads": 4}),
    "cohere": ("CohereConfig", "CohereModel", _DECODER),
    "vit": ("ViTConfig", "ViTModel", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                                      "intermediate_size": 96, "image_size": 32, "patch_size": 8}),
    "mpt": ("MptConfig", "MptModel", {"n_layers": 2, "n_heads": 4, "d_model": 64, "max_seq_len": 64}),
    # Falcon-7B's arrangement: multi-query attention, one LayerNorm for the parallel attention and MLP, RoPE.
    "falcon": ("FalconConfig", "FalconModel", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                                               "max_position_embeddings": 64}),
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
    eager_only = ("gemma2", "bloom", "mpt")  # transformers has no sdpa path for them
    implementation = "eager" if model_type in eager_only else "sdpa"
    config = getattr(transformers, config_name)(**keywords, vocab_size=97, attn_implementation=implementation)
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
                # Gemma (and Gemma 2) store the gain as w in (1 + w), so a small w is a gain near 1 there too.
                offset = 0.0 if model_type in ("gemma", "gemma2", "gemma3_text") else 1.0
                parameter.copy_(torch.randn_like(parameter) * 0.1 + offset)
    return load(model)


def plain_layer_seconds(adapter, input_ids, repeats: int = 5) -> list[float]:
    """Seconds of each layer inside the model's own forward pass (median of ``repeats`` passes): the time from the
    layer's input tap to its block-output tap, so the baseline is that very layer of the plain forward."""
    n_layer = len(adapter.layers)
    runs: list[list[float]] = []
    for _ in range(repeats + 1):  # the first pass warms up and is dropped
        entered, left = [0.0] * n_layer, [0.0] * n_layer

        def note(layer: int, field: str, _tensor, entered=entered, left=left) -> None:
            if field == "block_input":
                entered[layer] = time.perf_counter()
            elif field == "block_output":
                left[layer] = time.perf_counter()

        with adapter.inference(), adapter.layer_input_taps(note), adapter.layer_output_taps(note):
            adapter.forward(input_ids, None)
        runs.append([b - a for a, b in zip(entered, left, strict=True)])
    return [statistics.median(run[i] for run in runs[1:]) for i in range(n_layer)]


def certified_layer_seconds(adapter, input_ids) -> list[float]:
    """Seconds per layer to compute its certified bounds alone (no estimates): the block's local bound with its
    attention factor (block_local_jacobian_bounds), the MHA Lipschitz bound and the T7 block bound (with its FFN
    bound), on the radii bound_model uses."""
    inputs = adapter.layer_inputs(input_ids)
    seconds = []
    for layer, entry in zip(adapter.layers, inputs, strict=True):
        attn = layer.attention
        x = entry.block_input.to(torch.float64)
        start = time.perf_counter()
        local = G.block_local_jacobian_bounds(x, layer)
        pre = layer.placement == "pre"
        radius = G.norm_output_radius_rms(layer.attn_norm) if pre else G.block_rms_norm(local.attention_input).amax()
        G.mha_lipschitz_bounds(attn, radius_rms=radius)
        G.block_lipschitz_upper_bound(layer, input_radius_rms=None if pre else float(G.block_rms_norm(x).amax()))
        seconds.append(time.perf_counter() - start)
    return seconds


def table_layer_seconds(name: str, adapter, input_ids, args: argparse.Namespace):
    """(bound_model's table, seconds of each layer's records, seconds of the gate before layer 0): per-layer times
    from bound_model's on_layer callback; the gate (finiteness and weights-fidelity checks) is timed apart."""
    import attnsens.study.bounds as study_bounds

    marks: list[float] = []
    gate = study_bounds.check_weights_fidelity

    def timed_gate(*gate_args, **gate_kwargs):
        result = gate(*gate_args, **gate_kwargs)
        marks.append(time.perf_counter())
        return result

    study_bounds.check_weights_fidelity = timed_gate
    try:
        start = time.perf_counter()
        table = bound_model(adapter, input_ids, n_queries=args.queries, iterations=args.iterations,
                            compare_placements=False, model_name=name,
                            on_layer=lambda _layer: marks.append(time.perf_counter()))  # fmt: skip
    finally:
        study_bounds.check_weights_fidelity = gate
    return table, [b - a for a, b in itertools.pairwise(marks)], marks[0] - start


def bench_model(name: str, adapter, args: argparse.Namespace) -> dict:
    input_ids = model_inputs(adapter, args.seq_len)
    start = time.perf_counter()
    adapter.layer_inputs(input_ids)
    forward_s = time.perf_counter() - start
    certified_layer_seconds(adapter, input_ids)  # warm-up: compiled θ kernels, first-use initialisation
    plain = plain_layer_seconds(adapter, input_ids)
    # Weight norms (spectral norms, factors) are remembered per weight tensor; each measured part starts without
    # them, as a fresh process does.
    rounding._CACHE.clear()
    certified = certified_layer_seconds(adapter, input_ids)
    rounding._CACHE.clear()
    table, per_layer, gate_s = table_layer_seconds(name, adapter, input_ids, args)
    bound_s, full_s = sum(certified), gate_s + sum(per_layer)
    layers = table[table["head"] == -1]
    estimate = layers["mha_jacobian_estimate"]
    ratios = {
        "theta_aware_local": (layers["mha_local_jacobian_upper_bound"] / estimate).tolist(),
        "paper_form_local": (layers["mha_local_paper_form_upper_bound"] / estimate).tolist(),
        "lipschitz_theta_1": (layers["mha_lipschitz_upper_bound"] / estimate).tolist(),
        "length_dependent_naive": (layers["mha_length_dependent_upper_bound"] / estimate).tolist(),
        "block_local": (layers["residual_jacobian_upper_bound"] / layers["block_jacobian_estimate"]).tolist(),
    }
    n_tokens = adapter.sequence_shape(input_ids)[1]
    print(f"\n{name}: {len(layers)} layers, {n_tokens} tokens, {torch.get_num_threads()} thread(s)")
    print(f"{'layer':>5} {'θ̃ max':>7} {'estimate':>9} {'local/est':>10} {'paper/est':>10} {'θ=1 Lip/est':>12} "
          f"{'naive/est':>10} {'block/est':>10} {'fwd ms':>8} {'cert ms':>8} {'cert/fwd':>9} {'table ms':>9} "
          f"{'table/fwd':>10}")  # fmt: skip
    for i, row in enumerate(layers.to_dict("records")):
        print(f"{row['layer']:>5} {row['theta_tilde']:>7.3f} {row['mha_jacobian_estimate']:>9.3g} "
              f"{ratios['theta_aware_local'][i]:>10.2f} {ratios['paper_form_local'][i]:>10.2f} "
              f"{ratios['lipschitz_theta_1'][i]:>12.2f} {ratios['length_dependent_naive'][i]:>10.2f} "
              f"{ratios['block_local'][i]:>10.3g} {plain[i] * 1e3:>8.2f} {certified[i] * 1e3:>8.1f} "
              f"{certified[i] / plain[i]:>9.0f} {per_layer[i] * 1e3:>9.1f} "
              f"{per_layer[i] / plain[i]:>10.0f}")  # fmt: skip
    medians = {k: statistics.median(v) for k, v in ratios.items()}
    within_goal = sum(r <= 10 for r in ratios["theta_aware_local"])
    print("median ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    worst = max(ratios["theta_aware_local"])
    print(f"θ-aware local bound / estimate: median {medians['theta_aware_local']:.2f}, worst {worst:.2f}; "
          f"within 10× in {within_goal}/{len(layers)} layers")  # fmt: skip
    cert_ratio = statistics.median(c / f for c, f in zip(certified, plain, strict=True))
    table_ratio = statistics.median(t / f for t, f in zip(per_layer, plain, strict=True))
    print("per layer (fwd: the layer inside the model's plain forward, median of 5; cert: its certified bounds; "
          f"table: its bound_model records with estimates at {args.queries} queries × {args.iterations} steps): "
          f"median cert/fwd {cert_ratio:.0f}, median table/fwd {table_ratio:.0f}")  # fmt: skip
    print(f"time: certified bounds of all layers {bound_s:.3f} s vs one capturing forward {forward_s:.3f} s "
          f"(ratio {bound_s / forward_s:.1f}); full table with estimates {full_s:.1f} s, of which the gate "
          f"(finiteness, weights fidelity) {gate_s:.2f} s")  # fmt: skip
    return {
        "model": name, "n_layer": len(layers), "seq_len": int(adapter.sequence_shape(input_ids)[1]), "ratios": ratios,
        "median_ratios": medians, "worst_theta_aware_local": worst, "layers_within_goal": within_goal,
        "bound_seconds": bound_s,
        "forward_seconds": forward_s, "bound_over_forward": bound_s / forward_s, "table_seconds": full_s,
        "layer_forward_seconds": plain, "layer_certified_seconds": certified, "layer_table_seconds": per_layer,
        "gate_seconds": gate_s,
        "queries": args.queries, "iterations": args.iterations, "threads": torch.get_num_threads(),
    }  # fmt: skip


def model_inputs(adapter, seq_len: int):
    try:
        return adapter.encode(TEXT, max_length=seq_len)
    except InputError:  # no tokenizer (a random-init model): seeded random tokens, or a seeded image for ViT
        return probe_input_ids(adapter, seq_len)


def certified_seconds(adapter, input_ids) -> float:
    """Seconds of the certified bounds of all layers, weight norms computed afresh (after one warm-up pass)."""
    rounding._CACHE.clear()
    return sum(certified_layer_seconds(adapter, input_ids))


def compare_against(revision: str, names: list[str], loaders: dict, args: argparse.Namespace) -> None:
    """This tree's certified-bound time ÷ that of ``revision``, per model, alternating rounds (module docstring)."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), revision], check=True,
                       capture_output=True)  # fmt: skip
        try:
            env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{Path(__file__).parent}"}
            for name in names:
                adapter = loaders[name]()
                input_ids = model_inputs(adapter, args.seq_len)
                certified_layer_seconds(adapter, input_ids)  # warm-up
                here, there = [], []
                for _ in range(args.rounds):
                    here.append(certified_seconds(adapter, input_ids))
                    out = subprocess.run(
                        [sys.executable, __file__, "--certified-only", "--models", name, "--seq-len",
                         str(args.seq_len), "--threads", str(args.threads)],
                        check=True, capture_output=True, text=True, env=env,
                    )  # fmt: skip
                    there.append(json.loads(out.stdout.strip().splitlines()[-1])[name])
                a, b = statistics.median(here), statistics.median(there)
                print(f"{name}: certified bounds of all layers {a:.3f} s here, {b:.3f} s at {revision} "
                      f"(medians of {args.rounds}); here ÷ {revision} = {a / b:.2f}")  # fmt: skip
                append_record(RESULTS, {"bench": "bounds_against", "model": name, "revision": revision,
                                        "seconds_here": here, "seconds_revision": there, "ratio": a / b,
                                        "threads": torch.get_num_threads(), "provenance": provenance()})  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--queries", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models",
        default="all",
        help="comma-separated: tiny_gpt, tiny_gpt_trained, smollm2, minilm, family:<model_type>",
    )
    parser.add_argument("--against", metavar="REV", help="time the certified bounds here and at git revision REV")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of --against")
    parser.add_argument("--certified-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaders = {"tiny_gpt": tiny_gpt, "tiny_gpt_trained": tiny_gpt_trained, "smollm2": lambda: packaged("smollm2"),
               "minilm": lambda: packaged("minilm")}  # fmt: skip
    loaders.update({f"family:{family}": lambda family=family: tiny_family(family) for family in FAMILY_CONFIGS})
    names = list(loaders) if args.models == "all" else args.models.split(",")
    if args.certified_only:  # one measurement for --against, printed as JSON
        adapter = loaders[names[0]]()
        input_ids = model_inputs(adapter, args.seq_len)
        certified_layer_seconds(adapter, input_ids)
        print(json.dumps({names[0]: certified_seconds(adapter, input_ids)}))
        return
    if args.against:
        compare_against(args.against, names, loaders, args)
        return
    for name in names:
        try:
            adapter = loaders[name]()
        except Exception as err:  # a missing optional model must not stop the other benchmark
            print(f"{name}: skipped ({type(err).__name__}: {err})")
            continue
        record = bench_model(name, adapter, args)
        append_record(RESULTS, {"bench": "bounds", **record, "provenance": provenance()})


if __name__ == "__main__":
    main()
