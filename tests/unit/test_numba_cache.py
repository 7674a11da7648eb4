"""The kernels' on-disk cache is keyed by a hash of every kernel source (attnsens/_numba_cache.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnsens import _numba_cache

numba = pytest.importorskip("numba")


def test_every_kernel_source_is_hashed() -> None:
    names = {path.name for path in _numba_cache.kernel_sources()}
    package = Path(_numba_cache.__file__).parent
    assert {path.name for path in package.rglob("_numba_*.py")} - {"_numba_cache.py"} <= names
    assert "_numba_cache.py" not in names  # no kernel in it: editing it keeps the compiled kernels
    assert {"_float64.py", "methods.py", "_constants.py", "kernels.py"} <= names


def test_an_edit_to_any_source_changes_the_cache_folder(tmp_path: Path) -> None:
    copies = [Path(shutil.copy(path, tmp_path / path.name)) for path in _numba_cache.kernel_sources()]
    before = _numba_cache.kernel_source_hash(copies)
    assert before == _numba_cache.kernel_source_hash(copies)
    for copy in copies:
        original = copy.read_bytes()
        copy.write_bytes(original + b"\n# edited\n")
        assert _numba_cache.kernel_source_hash(copies) != before, f"an edit to {copy.name} kept the cache folder"
        copy.write_bytes(original)


def test_compiled_kernels_cache_in_the_keyed_folder() -> None:
    from attnsens.capture import _numba_moments
    from attnsens.theta import (
        _numba_cardinality,
        _numba_enumeration,
        _numba_first_fit,
        _numba_four_list,
        _numba_kernels,
        _numba_partition,
        _numba_refine,
        _numba_scan,
    )

    folder = str(_numba_cache.kernel_cache_dir())
    assert folder.endswith(f"kernels-{_numba_cache.kernel_source_hash()}")
    theta_kernels = (_numba_kernels, _numba_first_fit, _numba_partition, _numba_enumeration, _numba_cardinality)
    theta_kernels += (_numba_four_list,)
    for module in (*theta_kernels, _numba_refine, _numba_scan, _numba_moments):
        kernels = [f for f in vars(module).values() if isinstance(f, numba.core.registry.CPUDispatcher)]
        assert kernels, module.__name__
        for kernel in kernels:
            assert kernel._cache._cache_path.startswith(folder), f"{module.__name__}.{kernel.__name__}"


def test_numba_code_outside_attnsens_keeps_its_own_cache() -> None:
    from attnsens.theta import _numba_kernels  # noqa: F401  (decorators have run)

    assert numba.config.CACHE_DIR != str(_numba_cache.kernel_cache_dir())


def test_compilation_is_announced_once_per_kind_and_not_when_cached(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    compiling = {"fresh": True, "cached": False}
    monkeypatch.setattr(_numba_cache, "_ANNOUNCED", set())
    monkeypatch.setattr(_numba_cache, "compiles", lambda kernel, args: compiling[kernel])
    for _ in range(3):
        _numba_cache.note_compilation("fresh", (), "fresh kernels", "about a minute")
        _numba_cache.note_compilation("cached", (), "kernels on disk", "about a minute")
    with _numba_cache.notes_silenced():
        _numba_cache.note_compilation("fresh", (), "kernels warmed up", "about a minute")
    assert capsys.readouterr().err.splitlines() == [
        "note: compiling fresh kernels for this machine, once per version of attnsens (about a minute on two cores; "
        "`attnsens warmup` compiles every kernel ahead)"
    ]


def _moments_args(rows: np.ndarray) -> tuple[np.ndarray, ...]:
    count = rows.shape[0]
    out = [np.empty(count, dtype=dtype) for dtype in (np.float32, np.int64, np.float64, np.float64, np.float64)]
    return (rows, *out, np.empty(count, dtype=np.int64))


def test_compiles_reads_what_numba_has_in_memory_and_on_disk() -> None:
    """After a call, ``compiles`` says False for those argument types and True for types never compiled (numba
    internals moving would otherwise silence the note, or make it speak on every run)."""
    import torch

    from attnsens.capture import statistics
    from attnsens.capture._numba_moments import row_moments

    statistics.row_moments(torch.softmax(torch.randn(3, 7), dim=-1))
    assert not _numba_cache.compiles(row_moments, _moments_args(np.full((3, 7), 1 / 7, dtype=np.float32)))
    assert _numba_cache.compiles(row_moments, _moments_args(np.full((3, 7), 1 / 7, dtype=np.float16)))


def test_the_locator_files_kernels_by_module_and_stamps_them_by_content() -> None:
    from attnsens.capture import _numba_moments

    source = _numba_moments.__file__
    locator = _numba_cache.ContentCacheLocator.from_function(_numba_moments.row_moments.py_func, source)
    assert locator is not None
    assert locator.get_cache_path() == str(_numba_cache.kernel_cache_dir() / "capture._numba_moments")
    assert locator.get_source_stamp() == hashlib.sha256(Path(source).read_bytes()).hexdigest()
    assert _numba_moments.row_moments._cache._cache_path == locator.get_cache_path()
    assert _numba_cache.ContentCacheLocator.from_function(_moments_args, __file__) is None  # outside the package


def test_a_second_checkout_loads_the_kernels_the_first_compiled(tmp_path: Path) -> None:
    """A copy of the package elsewhere (new path, new file times) finds the first checkout's machine code: the
    row-moments call compiles nothing."""
    import torch

    from attnsens.capture.statistics import row_moments

    row_moments(torch.softmax(torch.randn(3, 7), dim=-1))  # compiled or loaded here
    package = Path(_numba_cache.__file__).parent
    shutil.copytree(package, tmp_path / "attnsens", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    script = (
        "import sys, torch, attnsens\n"
        f"assert attnsens.__file__.startswith({str(tmp_path)!r}), attnsens.__file__\n"
        "from attnsens.capture import statistics\n"
        "from attnsens.capture._numba_moments import row_moments\n"
        "statistics.row_moments(torch.softmax(torch.randn(3, 7), dim=-1))\n"
        "print(sum(row_moments.stats.cache_hits.values()), sum(row_moments.stats.cache_misses.values()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0"], done.stdout + done.stderr


def test_the_index_file_the_note_reads_is_where_numba_writes_it() -> None:
    """After a call, the θ entry kernel's index file exists at the path note_compilation checks (numba
    internals moving would otherwise silence the note, or make it speak on every run)."""
    import torch

    from attnsens.theta import _numba_kernels, certify

    certify(torch.softmax(torch.randn(4, 40), dim=-1))
    index = Path(_numba_kernels.certify_rows_serial._cache._cache_file._index_path)
    assert index.is_file() and index.parent.is_relative_to(_numba_cache.kernel_cache_dir())
