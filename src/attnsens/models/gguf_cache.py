"""GGUF checkpoints converted once into a safetensors folder, so that later loads skip the GGUF parse.

transformers reads a ``.gguf`` file by parsing all of its metadata and dequantizing every tensor, and it parses
the file again for the configuration, for the weights and for the tokenizer: about 20 s for SmolLM2-135M on two
cores, against about 2 s for the same model as a safetensors folder (``one_parse_per_file`` lets the three reads
share one parse). The first load of a GGUF file therefore
saves what transformers made of it — ``config.json``, ``model.safetensors`` with the dequantized float32 weights,
the tokenizer files — in ``<root>/<stem>-<key>``, and every later load reads that folder. The root is
``$ATTNSENS_MODEL_CACHE`` when set, else ``$XDG_CACHE_HOME/attnsens/models`` (``~/.cache/attnsens/models``);
``make clean-cache`` removes it.

The key hashes the file's resolved path, size and modification time and the transformers version, so an edited
file or another converter gets a new folder. The folder is written under a temporary name and renamed when
complete, so a conversion cut short is never read, and two processes converting at once both end with a complete
folder. Weights are saved in float32 whatever dtype the caller asked for (a cast happens after the load), so a
bfloat16 load never rounds what a later float32 load reads. A folder that cannot be written (read-only home, full
disk) only costs the next load the GGUF parse again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

MARKER = "attnsens-gguf-source.json"
"""Written last into a converted folder: the GGUF file it came from (a folder without it is not used)."""


def cache_root() -> Path:
    """The folder that holds one converted folder per GGUF file version (module docstring)."""
    if os.environ.get("ATTNSENS_MODEL_CACHE"):
        return Path(os.environ["ATTNSENS_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnsens" / "models"


def converted_folder(gguf_path: str | os.PathLike[str]) -> Path:
    """Where the conversion of this version of ``gguf_path`` lives (whether or not it exists yet)."""
    import transformers

    path = Path(gguf_path).resolve()
    status = path.stat()
    source = f"{path}\0{status.st_size}\0{status.st_mtime_ns}\0{transformers.__version__}"
    return cache_root() / f"{path.stem}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def cached_conversion(gguf_path: str | os.PathLike[str]) -> Path | None:
    """The complete converted folder of ``gguf_path``, or None when there is none yet."""
    folder = converted_folder(gguf_path)
    return folder if (folder / MARKER).is_file() else None


def save_conversion(gguf_path: str | os.PathLike[str], write: Callable[[Path], None]) -> Path | None:
    """Let ``write(folder)`` fill a temporary folder, then publish it as the conversion of ``gguf_path``.

    Returns:
        The published folder, or None when it could not be written (the caller keeps what it loaded).
    """
    final = converted_folder(gguf_path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError:
        return None
    try:
        write(staging)
        (staging / MARKER).write_text(json.dumps({"gguf": str(Path(gguf_path).resolve())}) + "\n")
        os.replace(staging, final)
    except OSError:
        # Another process published the same conversion first (the rename finds a full folder), or the disk refused.
        return cached_conversion(gguf_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after the rename; a partial folder otherwise
    return final


@contextlib.contextmanager
def one_parse_per_file() -> Iterator[None]:
    """While open, transformers' three reads of a GGUF file (configuration, tokenizer, weights) share one parse.

    transformers builds a fresh ``gguf.GGUFReader`` for each read, and decoding every metadata field costs seconds
    for a tokenizer of 49,152 tokens; its weight loader also rebuilds gguf's tensor-name table (a pure function of
    the architecture and the block count) once per tensor. Both are looked up on the ``gguf`` module at call time,
    so for the length of the conversion they are replaced by memoizing versions: the reader is read-only (a memory
    map) and shared per path, the table is computed once per key. The originals are restored on exit; if a future
    gguf lacks either name, it is left alone and the conversion only takes longer.
    """
    import gguf

    originals: dict[str, Any] = {name: getattr(gguf, name, None) for name in ("GGUFReader", "get_tensor_name_map")}
    reader_type, name_map = originals["GGUFReader"], originals["get_tensor_name_map"]
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = reader_type(path, mode)
        return readers[key]

    try:
        if reader_type is not None:
            setattr(gguf, "GGUFReader", shared_reader)  # noqa: B010 (the module attribute transformers looks up)
        if name_map is not None:
            setattr(gguf, "get_tensor_name_map", functools.cache(name_map))  # noqa: B010
        yield
    finally:
        for name, original in originals.items():
            if original is not None:
                setattr(gguf, name, original)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""GGUF metadata value types with a fixed size (8 = string and 9 = array are read apart), as struct formats."""
_STRING, _ARRAY = 8, 9


def gguf_context_length(path: str | os.PathLike[str]) -> int | None:
    """``<architecture>.context_length`` from a GGUF file's metadata (version 2 or 3), or None when absent.

    Reads the key–value header up to the two keys it needs and skips the rest without decoding it: milliseconds,
    where transformers' reader decodes every field of the file (seconds for a tokenizer of 49,152 tokens) before
    the configuration can be read. It serves the context check that precedes the first load of a GGUF file.
    """
    with open(path, "rb") as handle:
        magic, version = handle.read(4), _read(handle, "<I")
        if magic != b"GGUF" or version not in (2, 3):
            return None
        _read(handle, "<Q")  # tensor count
        architecture = None
        for _ in range(_read(handle, "<Q")):
            key, kind = _read_string(handle), _read(handle, "<I")
            if key == "general.architecture" and kind == _STRING:
                architecture = _read_string(handle)
            elif architecture is not None and key == f"{architecture}.context_length" and kind in _SCALARS:
                return int(_read(handle, _SCALARS[kind]))
            else:
                _skip_value(handle, kind)
    return None


def _read(handle: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise ValueError("the GGUF header ends early")
    return struct.unpack(fmt, data)[0]


def _read_string(handle: BinaryIO) -> str:
    return handle.read(_read(handle, "<Q")).decode("utf-8", errors="replace")


def _skip_value(handle: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        handle.seek(struct.calcsize(_SCALARS[kind]), os.SEEK_CUR)
    elif kind == _STRING:
        handle.seek(_read(handle, "<Q"), os.SEEK_CUR)
    elif kind == _ARRAY:
        element, count = _read(handle, "<I"), _read(handle, "<Q")
        if element in _SCALARS:
            handle.seek(count * struct.calcsize(_SCALARS[element]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(handle, element)
    else:
        raise ValueError(f"unknown GGUF metadata type {kind}")
