"""numba's on-disk cache for attnsens' kernels, in a folder named by a hash of every kernel source.

numba checks a cached function only against the file that defines it, so a kernel that calls (or inlines) a
function of another module keeps its old machine code after that module is edited. Every compiled function of
attnsens is declared with ``cached_njit``, which files it under ``kernels-<hash>``: the hash covers the
``_numba_*.py`` kernel sources (not this module, which compiles nothing) and the Python modules whose constants
and names they compile in, so an edit to any of them starts from an empty folder and recompiles everything. The
folders live in ``$NUMBA_CACHE_DIR`` when that is set, else in ``$XDG_CACHE_HOME/attnsens/numba``
(``~/.cache/attnsens/numba``); ``make clean-cache`` removes them.

Inside a folder, a kernel's files are named by its module's path within the package (``theta._numba_kernels``)
and stamped with the hash of its source's bytes (``ContentCacheLocator``): numba's own locators file them under a
hash of the source folder's absolute path (and numba < 0.68 stamps them with the file's mtime), so a second
checkout or a reinstall of the same version elsewhere compiled everything again. ``attnsens warmup`` compiles
every kernel ahead of the first command (``attnsens.warmup``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numba

_PACKAGE = Path(__file__).resolve().parent
COMPILED_CONSTANTS = ("_float64.py", "theta/methods.py", "theta/_constants.py", "theta/kernels.py")
"""Modules without kernels whose values the kernels compile in: the integers and floats they read as compile-time
constants, and ``theta/kernels.py``, the names through which capture's kernels call theta's."""


def kernel_sources() -> list[Path]:
    """Every file whose content the compiled kernels depend on, in a fixed order. This module is not one: it
    compiles nothing, and an edit to it would otherwise throw away every compiled kernel."""
    kernels = sorted(path for path in _PACKAGE.rglob("_numba_*.py") if path.name != "_numba_cache.py")
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


def _locator_base() -> type:
    """numba's abstract cache locator (``numba.core.caching._CacheLocator``, the same name since numba 0.49)."""
    from numba.core import caching

    return caching._CacheLocator


def _cache_impl() -> Any:
    """numba's class that picks a function's locator: ``CacheImpl`` (numba ≥ 0.68) or ``_CacheImpl`` (before)."""
    from numba.core import caching

    return getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")  # noqa: B009


@functools.cache
def _source_digest(path: str) -> str:
    """SHA-256 of the bytes of ``path`` (a kernel source), read once per process."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class ContentCacheLocator(_locator_base()):  # type: ignore[misc]
    """Where numba caches a function of attnsens: ``kernel_cache_dir() / <module path in the package>``, stamped
    with the SHA-256 of its source's bytes; neither depends on where the package lies nor on file times, so every
    checkout and install of one version shares one set of compiled kernels. Functions outside the package get no
    locator here (``from_function`` returns None) and go to numba's own."""

    def __init__(self, py_func: Any, py_file: str, module_path: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / module_path)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        return _source_digest(self._py_file)

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> ContentCacheLocator | None:
        try:
            relative = Path(py_file).resolve().relative_to(_PACKAGE)
        except (OSError, ValueError):
            return None
        locator = cls(py_func, py_file, ".".join(relative.with_suffix("").parts))
        try:
            locator.ensure_cache_path()
        except OSError:  # not writable: numba's own locators decide
            return None
        return locator


_KERNELS: list[Any] = []
"""Every function declared with ``cached_njit``, in declaration order (``declared_kernels``)."""


def cached_njit(**options):
    """``numba.njit(cache=True, **options)`` with the cache in ``kernel_cache_dir()`` (``ContentCacheLocator``).

    numba picks a function's locator when the decorator runs, from ``CacheImpl._locator_classes``; ours is put first
    for that moment only, so numba code outside attnsens keeps numba's own cache.
    """

    def decorate(function):
        impl = _cache_impl()
        previous = impl._locator_classes
        impl._locator_classes = [ContentCacheLocator, *previous]
        try:
            kernel = numba.njit(cache=True, **options)(function)
        finally:
            impl._locator_classes = previous
        _KERNELS.append(kernel)
        return kernel

    return decorate


def declared_kernels() -> tuple[Any, ...]:
    """The numba dispatchers declared so far with ``cached_njit`` (those of the modules imported)."""
    return tuple(_KERNELS)


_ANNOUNCED: set[str] = set()
_READY: dict[tuple[int, str], Any] = {}
"""(kernel id, dtype of its first argument) of the calls seen compiled or cached, each with its kernel (held, so
that no id is reused): the types of a call's arguments take 10–20 µs to work out, a tenth of a one-row
``certify`` call, and every entry kernel's argument types follow from its first argument's dtype."""


def compiles(kernel: Any, args: tuple[Any, ...]) -> bool:
    """Whether calling ``kernel`` (a ``cached_njit`` function) with ``args`` compiles: no machine code for their
    types in this process nor in its cache index (numba's ``Cache._index_key``, the key it looks up on load)."""
    key = (id(kernel), str(getattr(args[0], "dtype", type(args[0]).__name__)))
    if key in _READY:
        return False
    try:
        types = tuple(kernel.typeof_pyval(arg) for arg in args)
        ready = types in kernel.overloads
        if not ready:
            cache = kernel._cache
            ready = cache._index_key(types, kernel.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:  # numba's internals moved: say nothing rather than something wrong
        ready = True
    if ready:
        _READY[key] = kernel
    return not ready


_SILENT: list[bool] = []
"""Non-empty while ``notes_silenced`` is active."""


@contextlib.contextmanager
def notes_silenced() -> Iterator[None]:
    """No compile note inside: ``attnsens warmup`` says what it compiles in its own words."""
    _SILENT.append(True)
    try:
        yield
    finally:
        _SILENT.pop()


def note_compilation(kernel: Any, args: tuple[Any, ...], what: str, about: str) -> None:
    """Says on stderr, once per process and ``what``, that calling ``kernel`` with ``args`` compiles ``what`` (for
    ``about``, the time measured on two cores): its machine code for these argument types is neither in this
    process nor on disk. That happens on a fresh install without ``attnsens warmup`` and after an edit to a kernel
    source, and a user would otherwise sit through it without a word."""
    if _SILENT or what in _ANNOUNCED or not compiles(kernel, args):
        return
    _ANNOUNCED.add(what)
    sys.stderr.write(
        f"note: compiling {what} for this machine, once per version of attnsens ({about} on two cores; "
        "`attnsens warmup` compiles every kernel ahead)\n"
    )
