"""attnsens — certified attention sensitivity for transformers.

Subpackages load on first use, so ``import attnsens`` stays cheap::

    import attnsens as A
    cert = A.theta.certify(p)            # certified θ(p) interval per attention row
"""

from __future__ import annotations

import importlib
from types import ModuleType

__version__ = "0.2.0"

_SUBPACKAGES = (
    "capture",
    "errors",
    "geometry",
    "influence",
    "models",
    "report",
    "store",
    "study",
    "theta",
    "train",
    "weights",
)

__all__ = [*_SUBPACKAGES, "__version__"]


def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'attnsens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
