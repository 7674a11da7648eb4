"""Pipelines over models and checkpoints: audit, bounds, the early-training study.

Each pipeline is re-exported here by name: ``audit`` (module ``attnsens.study.auditing``; its inputs,
``attnsens.study.inputs``), ``bound_model`` (``attnsens.study.bounds``) and ``run_study`` with its ``StudyConfig``
(``attnsens.study.study``).
"""

from __future__ import annotations

from attnsens.study.auditing import AuditResult, audit
from attnsens.study.bounds import bound_model
from attnsens.study.study import StudyConfig, run_study

__all__ = ["AuditResult", "StudyConfig", "audit", "bound_model", "run_study"]
