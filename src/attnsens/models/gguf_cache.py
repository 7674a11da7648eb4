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
import math
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
    Raises ValueError for a header that ends early or claims more than the file holds.
    """
    with open(path, "rb") as handle:
        header = _Header(handle)
        magic, version = handle.read(4), header.read("<I")
        if magic != b"GGUF" or version not in (2, 3):
            return None
        header.read("<Q")  # tensor count
        architecture = None
        for _ in range(header.count("metadata entries", _SMALLEST_ENTRY)):
            key, kind = header.string(), header.read("<I")
            if key == "general.architecture" and kind == _STRING:
                architecture = header.string()
            elif architecture is not None and key == f"{architecture}.context_length" and kind in _SCALARS:
                return int(header.read(_SCALARS[kind]))
            else:
                header.skip_value(kind)
    return None


def check_gguf_header(path: str | os.PathLike[str]) -> None:
    """Refuse a GGUF file whose header transformers' reader would fail on or trust beyond the file.

    Walks the whole header without decoding it — every metadata entry, every tensor's name, dimensions and type —
    and checks each count and length against the bytes the file has left, and each tensor's element count against
    the bytes its data can take (no GGML type stores a weight in less than one bit). transformers' reader would
    otherwise stop with a ``struct.error`` on a count the file cannot hold, or try to allocate a string or tensor
    that a few bytes of header claim.

    Raises:
        FileFormatError: one line naming the file and what in its header is wrong.
    """
    from attnsens.errors import FileFormatError

    try:
        with open(path, "rb") as handle:
            header = _Header(handle)
            magic, version = handle.read(4), header.read("<I")
            if magic != b"GGUF":
                raise ValueError("it does not start with the GGUF magic bytes")
            if version not in (2, 3):
                raise ValueError(f"its format version is {version}; attnsens reads GGUF versions 2 and 3")
            tensors = header.read("<Q")
            for _ in range(header.count("metadata entries", _SMALLEST_ENTRY)):
                header.string()
                header.skip_value(header.read("<I"))
            if tensors > header.remaining() // _SMALLEST_TENSOR:
                raise ValueError(
                    f"it claims {tensors:,} tensors, more than the {header.remaining():,} bytes left after its "
                    "metadata can describe"
                )
            elements = []
            for _ in range(tensors):
                name = header.string()
                dimensions = header.read("<I")
                if dimensions > _MAX_DIMENSIONS:
                    raise ValueError(f"tensor {name!r} claims {dimensions} dimensions (GGUF allows {_MAX_DIMENSIONS})")
                elements.append((name, math.prod(header.read("<Q") for _ in range(dimensions))))
                header.read("<I")  # type
                header.read("<Q")  # offset in the data
            for name, count in elements:
                if count > 8 * header.remaining():
                    raise ValueError(
                        f"tensor {name!r} claims {count:,} elements, more than the {header.remaining():,} bytes "
                        "of tensor data can hold"
                    )
    except ValueError as err:
        raise FileFormatError(f"GGUF file {str(path)!r} is damaged: {err}; get the file again") from None
    except OSError as err:
        raise FileFormatError(f"cannot read GGUF file {str(path)!r} ({err.strerror or err}); check the path") from None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""GGUF metadata value types with a fixed size (8 = string and 9 = array are read apart), as struct formats."""
_STRING, _ARRAY = 8, 9
_SMALLEST_ENTRY = 8 + 4 + 1
"""Bytes of the smallest metadata entry: the key's length, the value type and a one-byte value."""
_SMALLEST_TENSOR = 8 + 4 + 4 + 8
"""Bytes of the smallest tensor description: the name's length, the dimension count, the type and the offset."""
_MAX_DIMENSIONS = 4
"""GGML_MAX_DIMS: the most dimensions a GGUF tensor has."""
_MAX_NESTING = 8
"""Arrays of arrays deeper than this are refused (GGUF writers nest one level at most)."""


class _Header:
    """Reads a GGUF header, refusing any count or length that the bytes left in the file cannot hold (ValueError):
    nothing is ever allocated or looped over on the header's word alone."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.size = os.fstat(handle.fileno()).st_size

    def remaining(self) -> int:
        return max(0, self.size - self.handle.tell())

    def read(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.handle.read(size)
        if len(data) != size:
            raise ValueError("the GGUF header ends early")
        return struct.unpack(fmt, data)[0]

    def count(self, what: str, smallest: int) -> int:
        """A count of items of at least ``smallest`` bytes each."""
        value = int(self.read("<Q"))
        if value > self.remaining() // smallest:
            raise ValueError(
                f"it claims {value:,} {what}, more than the {self.remaining():,} bytes left in the file can hold "
                "(the header ends early or is corrupt)"
            )
        return value

    def length(self) -> int:
        """A string's length in bytes."""
        value = int(self.read("<Q"))
        if value > self.remaining():
            raise ValueError(
                f"a string at byte {self.handle.tell() - 8:,} claims {value:,} bytes, more than the "
                f"{self.remaining():,} left in the file (the header ends early or is corrupt)"
            )
        return value

    def string(self) -> str:
        return self.handle.read(self.length()).decode("utf-8", errors="replace")

    def skip(self, size: int) -> None:
        if size > self.remaining():
            raise ValueError("the GGUF header ends early")
        self.handle.seek(size, os.SEEK_CUR)

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if kind in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[kind]))
        elif kind == _STRING:
            self.skip(self.length())
        elif kind == _ARRAY:
            if depth >= _MAX_NESTING:
                raise ValueError(f"it nests arrays more than {_MAX_NESTING} deep")
            element = self.read("<I")
            smallest = struct.calcsize(_SCALARS[element]) if element in _SCALARS else 8
            count = self.count("array elements", smallest)
            if element in _SCALARS:
                self.skip(count * smallest)
            else:
                for _ in range(count):
                    self.skip_value(element, depth + 1)
        else:
            raise ValueError(f"unknown GGUF metadata type {kind}")
