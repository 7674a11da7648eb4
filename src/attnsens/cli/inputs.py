"""Checks and loaders every command shares: text files, output paths, devices and MODEL arguments.

Each check runs before anything expensive (loading a model, training) and raises an AttnsensError whose message
speaks the command line's language: the flag, the offending value and the fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnsens.errors import ConfigError, FileFormatError


def read_text_file(path: Path, flag: str = "--text") -> str:
    """The UTF-8 text of ``path``; FileFormatError naming ``flag`` when it is missing or not UTF-8 (UTF-16 and
    UTF-32 named as such, with their conversion)."""
    if not path.is_file():
        raise FileFormatError(f"{flag} {path} does not exist or is not a file; check the path")
    from attnsens._encoding import conversion_advice, detect_wide_encoding

    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
        if detect_wide_encoding(head) is not None:  # UTF-16 of ASCII text would decode as UTF-8 with NULs
            raise FileFormatError(f"{flag} {path} {conversion_advice(path)}")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(f"{flag} {path} {conversion_advice(path, err)}") from err
    except OSError as err:
        raise FileFormatError(f"cannot read {flag} {path} ({err.strerror}); check its permissions") from err


def read_token_ids(path: Path, flag: str = "--ids") -> Any:
    """Token ids from ``path``: a tensor saved by ``torch.save`` (.pt, .pth, read with ``weights_only``), a NumPy
    array (.npy), or text with integers separated by spaces or commas, one sequence a line. Returns an integer
    tensor [n] (one sequence, or one stream to cut into windows) or [batch, n]; FileFormatError naming ``flag``
    and the fix otherwise (the ids' range is checked against the model's vocabulary where they are used)."""
    import pickle
    import warnings

    import numpy as np
    import torch

    if not path.is_file():
        raise FileFormatError(f"{flag} {path} does not exist or is not a file; check the path")
    if path.suffix.lower() in (".pt", ".pth", ".npy"):
        try:
            if path.suffix.lower() == ".npy":
                loaded = torch.from_numpy(np.load(path, allow_pickle=False))
            else:
                with warnings.catch_warnings():  # torch warns of a file's pickle protocol before refusing it
                    warnings.simplefilter("ignore")
                    loaded = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:  # its message would advise weights_only=False
            raise FileFormatError(
                f"{flag} {path} holds pickled Python objects, which attnsens does not run (torch.load "
                "weights_only=True); save the ids with torch.save(tensor) or np.save, or as text"
            ) from err
        except Exception as err:  # torch.load and np.load raise many types for a file that is not theirs
            raise FileFormatError(
                f"cannot read {flag} {path} ({type(err).__name__}: {err}); save the ids with torch.save or np.save, "
                "or as text"
            ) from err
    else:
        lines = [line.replace(",", " ").split() for line in read_text_file(path, flag).splitlines()]
        lines = [line for line in lines if line]
        if not lines:
            raise FileFormatError(f"{flag} {path} holds no token ids; give integers separated by spaces or commas")
        lengths = sorted({len(line) for line in lines})
        if len(lengths) > 1:
            raise FileFormatError(
                f"{flag} {path}: its lines hold different numbers of token ids ({lengths}); give sequences of one "
                "length, or all the ids on one line as one stream"
            )
        try:
            loaded = torch.tensor([[int(token) for token in line] for line in lines], dtype=torch.long)
        except ValueError as err:
            raise FileFormatError(
                f"{flag} {path}: {err}; give integer token ids separated by spaces or commas"
            ) from err
    if not isinstance(loaded, torch.Tensor):
        raise FileFormatError(f"{flag} {path} holds a {type(loaded).__name__}, not a tensor of token ids")
    if loaded.is_floating_point() or loaded.is_complex() or loaded.dtype == torch.bool:
        raise FileFormatError(f"{flag} {path} holds {loaded.dtype} values; token ids are integers")
    if loaded.ndim == 2 and loaded.shape[0] == 1:
        loaded = loaded[0]
    if loaded.ndim not in (1, 2) or loaded.numel() == 0:
        raise FileFormatError(f"{flag} {path}: token ids must be [n] or [batch, n], got shape {tuple(loaded.shape)}")
    return loaded.to(torch.long)


def check_out_file(path: Path, flag: str = "--out", example: str = "results.parquet") -> None:
    """``path`` can become a file: not a directory, and its folder is (or can be made) a directory."""
    if path.is_dir():
        raise FileFormatError(f"{flag} {path} is a directory; give a file path such as {path / example}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise FileFormatError(f"{flag} {path}: {parent} is not a directory; choose another path")


def default_out_dir(command: str, model: str) -> Path:
    """A new folder ``runs/<command>-<model>-<UTC time>`` (the command prints where its results went)."""
    import re
    import time

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or model).strip("_.") or "model"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path("runs") / f"{command}-{slug}-{stamp}"
    candidate, suffix = base, 1
    while candidate.exists():
        suffix += 1
        candidate = base.with_name(f"{base.name}-{suffix}")
    from attnsens.cli.interrupt import chosen_out

    chosen_out.set(candidate)  # named if the command is interrupted: a rerun resumes there with --out
    return candidate


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """``path`` can become a directory: it is not an existing file, nor inside one."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise FileFormatError(f"{flag} {path}: {candidate} is a file, not a directory; choose another path")
            return


@contextlib.contextmanager
def writing(path: Path, flag: str = "--out") -> Iterator[None]:
    """Turn a failure to write ``path`` into one FileFormatError (the store writes atomically: no partial file)."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or str(err).splitlines()[0]
        raise FileFormatError(
            f"cannot write {flag} {path} ({reason}); choose a writable location such as ./runs"
        ) from err


def check_exact_support(exact_support: int | None) -> None:
    """The library's check of ``exact_support``, its message in the command's words (--exact-support)."""
    from attnsens.theta.certificate import enumeration_support

    try:
        enumeration_support(exact_support)
    except ConfigError as err:
        advice = str(err).replace("exact_support=", "--exact-support ")
        raise ConfigError(advice.replace("use exact(p)", "use attnsens.theta.exact in Python")) from err


def check_device(device: str | None) -> None:
    """``device`` names a device this torch can use (None: the default choice)."""
    if device is None:
        return
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r} is not a device name; use cpu, cuda or cuda:N") from err
    if kind == "cuda" and not torch.cuda.is_available():
        build = "has no CUDA support" if torch.version.cuda is None else "sees no GPU"
        raise ConfigError(f"--device {device}: this torch {torch.__version__} {build}; use --device cpu")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r} is not supported; use cpu, cuda or cuda:N")


def saved_checkpoint(model: str, step: int | None, seed: int | None, placement: str | None = None) -> Any:
    """The SavedCheckpoint ``model`` names (attnsens.train.saved), or None; a step, seed or placement needs one."""
    from attnsens.train.saved import find_checkpoint

    found = find_checkpoint(model, step=step, seed=seed, placement=placement)
    given = [f for f, v in (("--step", step), ("--seed", seed), ("--placement", placement)) if v is not None]
    if found is None and given:
        flags, verb = " and ".join(given), "select" if len(given) > 1 else "selects"
        raise FileFormatError(
            f"{flags} {verb} a checkpoint of a run or study written by attnsens train/study, and {model!r} is "
            f"neither; drop {flags} or give such a folder"
        )
    return found


def check_model_path(model: str, *, revision: str | None = None) -> None:
    """Refuse a MODEL argument that names a local path that does not exist, saying so, before the loader reads it
    as a hub id: one that cannot be a hub id (``./x``, ``/x``, ``a/b/c``), and, while the hub is offline
    (HF_HUB_OFFLINE), one that could be but is neither a local path nor in the local hub cache."""
    import os

    from attnsens.models.loading import ALIASES

    if model in ALIASES or model.startswith("builtin:"):
        return  # the loader names the built-in models when one is unknown
    path = Path(model).expanduser()
    if path.exists():
        return
    aliases = ", ".join(sorted(ALIASES))
    missing = f"MODEL {model}: no file or folder {path.absolute()} exists; check the path"
    if not _could_be_hub_id(model):
        raise FileFormatError(f"{missing} (a MODEL is a local folder, a .gguf file, an alias ({aliases}) or a hub id)")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")
    if offline and not _in_hub_cache(model, revision):
        raise FileFormatError(
            f"{missing}; nor is {model!r} a hub id in the local cache, and the hub is offline (HF_HUB_OFFLINE=1)"
        )


def _could_be_hub_id(text: str) -> bool:
    """Whether ``text`` has the form of a hub repository id: ``name`` or ``namespace/name`` (huggingface_hub's
    rules: letters, digits, ``-``, ``_`` and ``.``, no ``--`` or ``..``, at most 96 characters)."""
    import re

    return (
        len(text) <= 96
        and re.fullmatch(r"(?:[\w.-]+/)?[\w.-]+", text, flags=re.ASCII) is not None
        and "--" not in text
        and ".." not in text
        and not text.startswith((".", "-"))
        and not text.endswith((".", "-", ".gguf"))
    )


def _in_hub_cache(repo_id: str, revision: str | None) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # an id the hub's own check refuses is not in the cache either
        return False
    return isinstance(found, str)


def check_context(model: str, saved: Any, seq_len: int, *, trust_remote_code: bool = False) -> None:
    """Refuse a --seq-len beyond the model's context, read from its configuration before the weights load (a
    folder that names code of its own is refused unless ``trust_remote_code``)."""
    from attnsens.errors import InputError
    from attnsens.models.loading import context_length

    context = context_length(model, trust_remote_code=trust_remote_code) if saved is None else saved.context_length()
    if context is not None and seq_len > context:
        raise InputError(
            f"--seq-len {seq_len} exceeds the context of {model!r} ({context} positions); "
            f"use --seq-len {context} or less"
        )


DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "float64": "float64", "fp64": "float64"}  # fmt: skip


def parse_dtype(dtype: str | None) -> Any:
    """The torch dtype a ``--dtype`` names (None: the default, float32)."""
    if dtype is None:
        return None
    import torch

    if dtype.lower() not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not a float type; use float32, bfloat16, float16 or float64")
    return getattr(torch, DTYPES[dtype.lower()])


def quiet_transformers() -> None:
    """Silence transformers' load bars and warnings: commands print their own progress, which these would break."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_model(
    model: str,
    saved: Any = None,
    *,
    trust_remote_code: bool = False,
    device: str | None = None,
    dtype: Any = None,
    revision: str | None = None,
    placed: dict[str, Any] | None = None,
) -> Any:
    """The adapter of a MODEL argument: ``saved`` (from ``saved_checkpoint``) when given, else ``models.load``;
    on ``device`` in ``dtype`` (defaults: cpu, float32), at hub ``revision`` (branch, tag or commit), its blocks
    placed by ``placed`` (:func:`weight_placement`) where given."""
    from attnsens.models import load

    quiet_transformers()
    if saved is not None:
        if placed:
            raise ConfigError("--device-map places the weights of a model folder or hub id, not of a training run")
        return load(saved, device=device, dtype=dtype)
    check_model_path(model, revision=revision)
    if placed:
        if device is not None:
            raise ConfigError("give --device or --device-map, not both: --device-map places every block itself")
        return load(model, trust_remote_code=trust_remote_code, dtype=dtype, revision=revision, **placed)
    return load(model, trust_remote_code=trust_remote_code, device=device, dtype=dtype, revision=revision)


@contextlib.contextmanager
def weight_placement(device_map: str | None, offload_folder: Path | None, out: Path | None) -> Iterator[dict[str, Any]]:
    """The ``device_map`` and ``offload_folder`` of ``load`` for --device-map and --offload-folder (empty without
    --device-map): a named strategy (auto, balanced, balanced_low_0, sequential) or MODULE=DEVICE pairs; weights
    offloaded to disk go to --offload-folder, or to a folder inside ``out`` removed when the context closes.

    Raises:
        ConfigError: a malformed --device-map, --offload-folder without it, or no folder for the disk.
    """
    if device_map is None:
        if offload_folder is not None:
            raise ConfigError("--offload-folder keeps the weights --device-map sends to disk; give --device-map too")
        yield {}
        return
    parsed = parse_device_map(device_map)
    if offload_folder is not None:
        yield {"device_map": parsed, "offload_folder": str(offload_folder)}
        return
    if out is None:
        raise ConfigError("--device-map may send weights to disk: give --offload-folder (or --out)")
    Path(out).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".offload-", dir=out))
    try:
        yield {"device_map": parsed, "offload_folder": str(folder)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_device_map(text: str) -> str | dict[str, Any]:
    """--device-map as ``from_pretrained`` takes it: a strategy name, or {module: device} from MODULE=DEVICE pairs
    (a device: cpu, disk, a GPU index N or cuda:N)."""
    if text in DEVICE_MAP_STRATEGIES:
        return text
    placed: dict[str, Any] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        module, _, where = pair.partition("=")
        if not module or not where:
            raise ConfigError(
                f"--device-map {text!r}: {pair!r} is not MODULE=DEVICE; give {', '.join(DEVICE_MAP_STRATEGIES)} or "
                "pairs such as layers.0=0,layers.1=disk"
            )
        placed[module.strip()] = int(where) if where.strip().isdigit() else where.strip()
    if not placed:
        raise ConfigError(f"--device-map {text!r} names no module; give auto or MODULE=DEVICE pairs")
    return placed


def join_ranks(device: str | None) -> str | None:
    """Join torchrun's process group when launched by it (gloo on the CPU, nccl on GPUs), and the device of this
    rank: ``cuda`` becomes ``cuda:LOCAL_RANK``, so that each rank audits on its own GPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    from attnsens.train.trainer import init_distributed

    init_distributed()
    if device == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device
