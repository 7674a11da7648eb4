"""Geometry tests run single-threaded: their tensors are tiny, and thread contention on a shared machine costs
more than parallelism gains."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Every test here uses the shared ``one_torch_thread`` fixture (tests/conftest.py)."""
