"""Bounds pipeline tests run single-threaded (tiny tensors; thread contention dominates on shared machines)."""

from __future__ import annotations

from tests.unit.geometry.conftest import _single_thread  # noqa: F401
