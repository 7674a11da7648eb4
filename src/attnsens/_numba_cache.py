"""numba's on-disk cache for attnsens' kernels, in a folder named by a hash of every kernel source.

numba checks a cached function only against the file that defines it, so a kernel that calls (or inlines) a
function of another module keeps its old machine code after that module is edited. Every compiled function of
attnsens is declared with ``cached_njit``, which files it under ``kernels-<hash>``: the hash covers all
``_numba_*.py`` sources and the Python modules whose constants they compile in, so an edit to any of them starts
from an empty folder and recompiles everything. The folders live in ``$NUMBA_CACHE_DIR`` when that is set, else
in ``$XDG_CACHE_HOME/attnsens/numba`` (``~/.cache/attnsens/numba``); ``make clean-cache`` removes them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numba

_PACKAGE = Path(__file__).resolve().parent
COMPILED_CONSTANTS = ("theta/methods.py", "theta/_constants.py")
"""Modules without kernels whose integers and floats the kernels read as compile-time constants."""


def kernel_sources() -> list[Path]:
    """Every file whose content the compiled kernels depend on, in a fixed order."""
    kernels = sorted(_PACKAGE.rglob("_numba_*.py"))
    return kernels + [_PACKAGE / name for name in COMPILED_CONSTANTS if (_PACKAGE / name).is_file()]


def kernel_source_hash(sources: list[Path] | None = None) -> str:
    """16 hex digits of SHA-256 over the file names and bytes of ``sources`` (default: ``kernel_sources()``)."""
    digest = hashlib.sha256()
    for path in kernel_sources() if sources is None else sources:
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """The folder that holds one ``kernels-<hash>`` folder per version of the kernel sources."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / "attnsens"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnsens" / "numba"


@functools.cache
def kernel_cache_dir() -> Path:
    """``cache_root() / kernels-<hash of the current sources>`` (computed once per process)."""
    return cache_root() / f"kernels-{kernel_source_hash()}"


def cached_njit(**options):
    """``numba.njit(cache=True, **options)`` with the cache in ``kernel_cache_dir()``.

    numba picks a function's cache folder when the decorator runs, from ``numba.config.CACHE_DIR``; it is set for
    that moment only, so numba code outside attnsens keeps its own cache.
    """

    # numba.config defines its options at import, from the environment, where a type checker cannot see them.
    config: Any = numba.config

    def decorate(function):
        previous = config.CACHE_DIR
        config.CACHE_DIR = str(kernel_cache_dir())
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            config.CACHE_DIR = previous

    return decorate


_ANNOUNCED: set[str] = set()
_COMPILED: dict[int, Any] = {}
"""The kernels seen compiled in this process, by id (held, so that no id is reused): numba's ``signatures`` takes
10–20 µs to build, a tenth of a one-row ``certify`` call."""


def note_compilation(kernel: Any, what: str) -> None:
    """Says on stderr, once per process, that the call about to be made compiles ``what``: ``kernel`` (a
    ``cached_njit`` function) is neither compiled in this process nor on disk. That happens on a fresh install and
    after an edit to a kernel source; measured on two cores, the θ cascade took 69 s to compile and the row
    statistics 38 s more, which a user would otherwise sit through without a word."""
    if what in _ANNOUNCED or id(kernel) in _COMPILED:
        return
    if getattr(kernel, "signatures", None):
        _COMPILED[id(kernel)] = kernel
        return
    index = getattr(getattr(getattr(kernel, "_cache", None), "_cache_file", None), "_index_path", None)
    if index is None or Path(index).exists():
        return
    _ANNOUNCED.add(what)
    sys.stderr.write(f"note: compiling {what} for this machine (once per version of attnsens; about a minute)\n")
