"""Load, audit and bound one tiny random-init model of every config class transformers knows, and sort the outcomes.

Each model type of an auto mapping (causal LMs by default, ``--kind encoder`` for masked LMs) is built from its
config class with layers, heads and widths made small where the config names them, run once on its own (a model
whose own forward fails is set aside: that is the config's doing, not attnsens'), then loaded, audited on 24
random tokens and bounded. A model that attnsens cannot serve must be refused by name (an ``AttnsensError``); any
other exception is a bug, printed as TRACEBACK with the line that raised it. One JSON line per model type, then
the counts.

    .venv/bin/python tools/family_sweep.py                    # every causal LM type (about 30 minutes here)
    .venv/bin/python tools/family_sweep.py doge gemma3 bart   # some types only
    .venv/bin/python tools/family_sweep.py --kind encoder

Config classes whose defaults ignore these sizes can build models of many GiB; the address space is capped
(``--max-gib``), so such a build fails with an allocation error instead of taking the machine down.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import signal
import traceback
import warnings
from types import FrameType
from typing import Any

SIZES = {
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "hidden_size": 64, "n_embd": 64, "d_model": 64,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
    "ffn_dim": 96, "vocab_size": 97, "max_position_embeddings": 64, "n_positions": 64, "head_dim": 16,
}  # fmt: skip
"""Config attributes set where the config has them (a config names its sizes in its own words)."""
TOKENS = 24


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Timeout


def _where(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"


def _build(model_type: str, kind: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids of the full vocabulary would not embed
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= SIZES["vocab_size"]:
            setattr(config, name, 0)
    for name, value in SIZES.items():
        if hasattr(config, name):
            try:
                setattr(config, name, value)
            except Exception:  # a derived or validated attribute: leave the config's own
                pass
    torch.manual_seed(0)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModel
    return auto.from_config(config).eval()


def sweep_one(model_type: str, kind: str, timeout_s: int) -> dict[str, str | int]:
    """The outcome of one model type: the stage that stopped it and why, or how far it went."""
    import torch

    import attnsens as A
    from attnsens.errors import AttnsensError

    result: dict[str, str | int] = {"type": model_type}
    try:
        signal.alarm(timeout_s)
        model = _build(model_type, kind)
    except _Timeout:
        return {**result, "build": "timeout"}
    except Exception as error:  # any failure to build is the config's
        return {**result, "build": f"{type(error).__name__}: {str(error)[:100]}"}
    finally:
        signal.alarm(0)
    ids = torch.randint(3, 90, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    adapter = None
    for stage in ("forward", "load", "audit", "bounds"):
        try:
            signal.alarm(timeout_s)
            if stage == "forward":
                with torch.no_grad():  # without a cache, as attnsens runs it (a BART decoder alone fails with one)
                    model(input_ids=ids, use_cache=False)
            elif stage == "load":
                adapter = A.models.load(model)
            elif stage == "audit":
                result["rows"] = len(A.study.audit(adapter, ids).rows)
            else:
                A.study.bound_model(adapter, ids, iterations=2)
                result["bounds"] = "ok"
        except _Timeout:
            result[stage] = "timeout"
            break
        except AttnsensError as error:
            result[stage] = f"refused ({type(error).__name__}): {str(error)[:160]}"
            break
        except Exception as error:  # sorted below: the forward's own, or attnsens' bug
            label = "failed" if stage == "forward" else "TRACEBACK"
            result[stage] = f"{label} {type(error).__name__}: {str(error)[:160]} at {_where(error)}"
            break
        finally:
            signal.alarm(0)
    return result


def outcome(result: dict[str, Any]) -> str:
    """One word-group per model: where it stopped."""
    if "build" in result:
        return "build failed"
    if "forward" in result:
        return "own forward failed"
    if result.get("bounds") == "ok":
        return "audited and bounded"
    for stage in ("load", "audit", "bounds"):
        if stage in result:
            text = str(result[stage])
            if text.startswith("refused"):
                return f"refused at {stage}" if stage != "bounds" else "audited, bounds refused"
            return f"{stage}: {text.split(' ')[0]}"
    return "unfinished"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("types", nargs="*", help="model types (default: every one of the mapping)")
    parser.add_argument("--kind", choices=("causal", "encoder"), default="causal")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per stage")
    parser.add_argument("--max-gib", type=float, default=12.0, help="address-space cap of this process")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    cap = int(args.max_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _alarm)
    from transformers.models.auto import modeling_auto

    mapping = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if args.kind == "causal"
        else modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )
    counts: collections.Counter[str] = collections.Counter()
    for model_type in args.types or sorted(mapping):
        result = sweep_one(model_type, args.kind, args.timeout)
        counts[outcome(result)] += 1
        print(json.dumps(result, ensure_ascii=False), flush=True)
    print(json.dumps(dict(counts.most_common())))


if __name__ == "__main__":
    main()
