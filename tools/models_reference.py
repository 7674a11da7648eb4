"""Write the family table of docs/models.md from the family registry; ``--check`` fails when the file is stale.

The table is generated from ``attnsens.models.loading.FAMILIES`` (model type → adapter), ``BYPASSES`` (families
refused by name), ``attnsens.models.interface.NO_BOUNDS`` (audited families whose bounds are refused, and why) and
``attnsens.models.layouts.LAYOUTS`` (what each family's block looks like). Everything in
docs/models.md after the line ``MARKER`` is written by hand and kept as it is.

    python tools/models_reference.py           # rewrite the generated part of docs/models.md
    python tools/models_reference.py --check   # exit 1 if it differs from the registry
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

TARGET = Path(__file__).resolve().parents[1] / "docs" / "models.md"
MARKER = "<!-- Generated above this line by tools/models_reference.py; written by hand below it. -->"
HEADER = """# Supported models

attnsens audits any Hugging Face transformers model whose attention goes through transformers'
attention-function interface, and computes certified bounds for the families below: each has a block layout
(`attnsens.models.layouts.LAYOUTS`) that reads its weights into the normalized form every bound consumes, behind the
weights-fidelity gate. The table is generated from the registry by `python tools/models_reference.py`
(`make docs`); a test and `make lint` fail when it is out of date. The notes after it, and the tests that show each
family's behaviour, are written by hand.
"""


def _registry() -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    from attnsens.models import layouts, loading

    for adapter in set(loading.FAMILIES.values()):  # adapters in their own modules add their layouts on import
        importlib.import_module(adapter.split(":")[0])
    return loading.FAMILIES, loading.BYPASSES, layouts.LAYOUTS


def _adapter_class(path: str) -> type:
    module_name, class_name = path.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def _block(layout: Any) -> str:
    if layout.attn_norm is None:
        parts = ["norms after each sublayer only"]
    elif layout.post_norm:
        parts = ["post-norm"]
    else:
        parts = ["pre-norm"]
        if layout.attn_out_norm is not None:
            parts.append("norms after the sublayers too")
    if layout.parallel_residual:
        parts.append("parallel" + (", one norm" if layout.attn_norm == layout.mlp_norm else ""))
    elif layout.parallel_if:
        parts.append(f"parallel under `{layout.parallel_if}`")
    if layout.residual_multiplier:
        parts.append(f"sublayers scaled by `{layout.residual_multiplier}`")
    if layout.layer_scale:
        parts.append("sublayers scaled per channel by " + " and ".join(f"`{name}`" for name in layout.layer_scale))
    if layout.beside_attention:
        parts.append(f"{layout.beside_attention} beside the attention (no block bound)")
    if layout.hybrid:
        parts.append(f"hybrid: its attention blocks alone (the others hold {layout.hybrid})")
    return "; ".join(parts)


def _norm(layout: Any) -> str:
    name = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[layout.norm]
    if layout.gamma_offset:
        name += f" (scale {layout.gamma_offset:g} + w)"
    if layout.norm_eps is not None:
        name += f", ε = {layout.norm_eps:g} fixed"
    return name


def _positions(layout: Any) -> str:
    if layout.alibi != "none":
        return f"ALiBi ({layout.alibi}'s slopes)"
    if layout.rotary == "none":
        return "learned or none (no RoPE)"
    if layout.rotary == "gptj":
        return "RoPE on adjacent pairs, `rotary_dim`"
    text = "RoPE" + (" on adjacent pairs" if layout.rotary_interleaved else "")
    if layout.rope_if:
        text += f" where `{layout.rope_if[0]}` is `{layout.rope_if[1]}`, else none"
    if layout.rotary_alpha:
        text += ' (a "dynamic" type with an `alpha`: the fixed NTK base stretch)'
    if layout.sliding_if:
        text += f", on the layers whose attention has `{layout.sliding_if}` (on every layer without a window)"
    return text + (f", on the layers whose attention has `{layout.rotary_if}`" if layout.rotary_if else "")


def _attention(layout: Any) -> str:
    parts = ["causal" if layout.causal else "bidirectional" + (f" (causal under `{layout.causal_if}`)" if
             layout.causal_if else "")]  # fmt: skip
    if layout.window == "config":
        parts.append("sliding window from the config")
    elif layout.window == "module":
        parts.append("sliding windows per layer" + (f" (where `{layout.sliding_if}`)" if layout.sliding_if else ""))
    if layout.qk_norm:
        parts.append("QK-norm" + (" after RoPE" if layout.qk_norm_after_rotary else ""))
    if layout.softcap:
        parts.append(f"logit softcap `{layout.softcap}`")
    if layout.qkv:
        parts.append(f"fused `{layout.qkv}`")
    return ", ".join(parts)


def _mlp(layout: Any) -> str:
    if layout.moe is not None:
        moe = layout.moe
        gates = (
            f"top-k of the softmax, renormalized under `{moe.renormalized_if}`" if moe.renormalized_if
            else "renormalized top-k" if moe.renormalized
            else "top-k of the softmax, not renormalized"
        )  # fmt: skip
        shared = ", a sigmoid-gated shared expert" if layout.moe.shared else ""
        return f"mixture of gated experts ({gates}{shared}); local bounds only"
    if layout.gate_up:
        return f"gated, fused `{layout.gate_up}`"
    if layout.swiglu_if:
        return f"plain, SwiGLU under `{layout.swiglu_if}`"
    return "gated" if layout.gate else "plain"


def _refused(layout: Any) -> str:
    reasons = [f"`{flag}`: {why}" for flag, why in layout.unsupported]
    if layout.experts:
        reasons.append(f"a block has a mixture of experts (`{layout.experts}`)")
    return "; ".join(reasons) or "—"


def render_table() -> str:
    families, bypasses, layouts = _registry()
    from attnsens.models.layouts import LayoutAdapter

    rows = [
        "| family (`model_type`) | adapter | block | norm | positions | attention | MLP | bounds refused when |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in sorted(families):
        adapter = _adapter_class(families[family])
        layout = layouts[family]
        if adapter.layout_for.__func__ is not LayoutAdapter.layout_for.__func__:
            variable = f"read from the config by `{adapter.__name__}.layout_for`"
            block, positions = variable, variable
        else:
            block, positions = _block(layout), _positions(layout)
        cells = [f"`{family}`", f"`{adapter.__name__}`", block, _norm(layout), positions, _attention(layout),
                 _mlp(layout), _refused(layout)]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    refused = "\n".join(f"- `{family}`: {why}." for family, why in sorted(bypasses.items()))
    from attnsens.models.interface import NO_BOUNDS

    unbounded = "\n".join(f"- `{family}`: {why}." for family, why in sorted(NO_BOUNDS.items()))
    return "\n".join(
        [
            HEADER,
            f"## Families with certified bounds ({len(families)})\n",
            *rows,
            "",
            "A config whose `do_layer_norm_before` is false (OPT) makes a pre-norm block post-norm; attnsens' own GPT",
            "(`attnsens.train.model.GPT`) is read by its own adapter, Pre-LN, Post-LN, DeepNorm or without norms.",
            "",
            "## Families refused by name before their weights load\n",
            refused,
            "",
            "Every other family is audit-only: its rows are audited when its attention calls the interface, and bounds",
            "are refused by name for want of a layout. These are refused with their reason:",
            "",
            unbounded,
            "",
            MARKER,
            "",
        ]
    )


def render(current: str) -> str:
    """docs/models.md with its generated part renewed and its hand-written part kept."""
    kept = current.split(MARKER, 1)[1].lstrip("\n") if MARKER in current else ""
    return render_table() + ("\n" + kept if kept else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/models.md is out of date")
    args = parser.parse_args(argv)
    current = TARGET.read_text(encoding="utf-8") if TARGET.is_file() else ""
    fresh = render(current)
    if args.check:
        if current != fresh:
            print("docs/models.md is out of date: run python tools/models_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
