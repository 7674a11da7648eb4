"""The kernels' on-disk cache is keyed by a hash of every kernel source (attnsens/_numba_cache.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnsens import _numba_cache

numba = pytest.importorskip("numba")


def test_every_kernel_source_is_hashed() -> None:
    names = {path.name for path in _numba_cache.kernel_sources()}
    package = Path(_numba_cache.__file__).parent
    assert {path.name for path in package.rglob("_numba_*.py")} <= names
    assert {"methods.py", "_constants.py"} <= names


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
    from attnsens.theta import _numba_kernels, _numba_partition, _numba_refine, _numba_scan

    folder = str(_numba_cache.kernel_cache_dir())
    assert folder.endswith(f"kernels-{_numba_cache.kernel_source_hash()}")
    for module in (_numba_kernels, _numba_partition, _numba_refine, _numba_scan, _numba_moments):
        kernels = [f for f in vars(module).values() if isinstance(f, numba.core.registry.CPUDispatcher)]
        assert kernels, module.__name__
        for kernel in kernels:
            assert kernel._cache._cache_path.startswith(folder), f"{module.__name__}.{kernel.__name__}"


def test_numba_code_outside_attnsens_keeps_its_own_cache() -> None:
    from attnsens.theta import _numba_kernels  # noqa: F401  (decorators have run)

    assert numba.config.CACHE_DIR != str(_numba_cache.kernel_cache_dir())
