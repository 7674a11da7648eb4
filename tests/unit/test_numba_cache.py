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


class _Kernel:
    """What note_compilation reads of a numba dispatcher: its compiled signatures and its cache index file."""

    def __init__(self, index: Path, signatures: list[str]) -> None:
        self.signatures = signatures
        self._cache = type("Cache", (), {"_cache_file": type("File", (), {"_index_path": str(index)})()})()


def test_compilation_is_announced_once_when_nothing_is_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_numba_cache, "_ANNOUNCED", set())
    index = tmp_path / "kernel.nbi"
    _numba_cache.note_compilation(_Kernel(index, ["(float32[:, :],)"]), "compiled in this process")
    _numba_cache.note_compilation(_Kernel(index, []), "fresh kernels")
    _numba_cache.note_compilation(_Kernel(index, []), "fresh kernels")
    index.touch()
    _numba_cache.note_compilation(_Kernel(index, []), "kernels on disk")
    assert capsys.readouterr().err.splitlines() == [
        "note: compiling fresh kernels for this machine (once per version of attnsens; about a minute)"
    ]


def test_the_index_file_the_note_reads_is_where_numba_writes_it() -> None:
    """After a call, the θ entry kernel's index file exists at the path note_compilation checks (numba
    internals moving would otherwise silence the note, or make it speak on every run)."""
    import torch

    from attnsens.theta import _numba_kernels, certify

    certify(torch.softmax(torch.randn(4, 40), dim=-1))
    index = Path(_numba_kernels.certify_rows_serial._cache._cache_file._index_path)
    assert index.is_file() and index.parent.is_relative_to(_numba_cache.kernel_cache_dir())
