"""GGUF checkpoints converted once into a safetensors folder, so that later loads skip the GGUF parse.

transformers reads a ``.gguf`` file by parsing all of its metadata and dequantizing every tensor, and it parses
the file again for the configuration, for the weights and for the tokenizer: about 20 s for SmolLM2-135M on two
cores, against about 2 s for the same model as a safetensors folder. The first load of a GGUF file therefore
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

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

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
