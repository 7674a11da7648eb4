"""Pipelines over models and checkpoints: audit, bounds, the early-training study.

Each pipeline function is re-exported here by name. Re-exports are eager because a function and its module
share a name (``attnsens.study.audit`` is both): importing the submodule alone would otherwise leave the module,
not the function, as the package attribute.
"""

from __future__ import annotations

from attnsens.study.audit import AuditResult, audit
from attnsens.study.bounds import bound_model

__all__ = ["AuditResult", "audit", "bound_model"]
