"""Every error attnsens raises for bad input or an impossible request.

Each subclass is an ``AttnsensError`` (itself a ``ValueError``), so callers can catch one type, and the CLI
turns any of them into one red line and exit code 1. Messages name the offending value or shape and the fix.
"""

from __future__ import annotations

__all__ = [
    "AttnsensError",
    "CheckpointError",
    "ConfigError",
    "FileFormatError",
    "InputError",
    "OutputWriteError",
    "QueryError",
    "RouterTieError",
    "RunIntegrityError",
    "RunLockedError",
    "ShapeError",
    "TooHardError",
    "UnsupportedModelError",
    "WeightsChangedError",
    "WeightsFidelityError",
]


class AttnsensError(ValueError):
    """Base class of all user-facing attnsens errors."""


class InputError(AttnsensError):
    """A tensor argument is unusable: NaN/Inf, negative probabilities, empty rows, bad row sums, bad dtype."""


class ShapeError(AttnsensError):
    """Tensor shapes do not fit together; the message shows the shapes."""


class ConfigError(AttnsensError):
    """A configuration value is out of range or inconsistent with another one."""


class TooHardError(AttnsensError):
    """An exact computation was requested beyond what can be proved within the budget."""


class FileFormatError(AttnsensError):
    """A file is missing, unreadable, or does not hold what was asked for."""


class RunIntegrityError(FileFormatError):
    """A run folder disagrees with its manifest: missing, changed, misplaced, unreadable or extra unit files."""


class OutputWriteError(FileFormatError):
    """A result could not be written (disk full, read-only folder); the folder is left as it was."""


class RunLockedError(AttnsensError):
    """Another process is writing the run folder (it holds the folder's lock)."""


class RouterTieError(AttnsensError):
    """A mixture of experts' choice of experts is not certified at an input (its k-th and (k+1)-th router logits
    lie within their evaluation error): no local bound of a fixed choice holds there."""


class UnsupportedModelError(AttnsensError):
    """A model family or layout that attnsens has no adapter for."""


class CheckpointError(AttnsensError):
    """A checkpoint is corrupted (hash mismatch), duplicated, or missing from its manifest."""


class QueryError(AttnsensError):
    """A SQL query over a run's results failed (syntax, unknown table or column)."""


class WeightsChangedError(AttnsensError):
    """A model's parameters changed after attnsens read its normalized weights: a bound would rest on stale ones."""


class WeightsFidelityError(AttnsensError):
    """Normalized weights do not reproduce the model's own block output: no bound may rest on them."""

    def __init__(
        self, *, family: str, layer: int, field: str, relative_error: float, tolerance: float, model: str = ""
    ) -> None:
        self.family, self.layer, self.field = family, layer, field
        self.relative_error, self.tolerance = relative_error, tolerance
        named = f" ({model})" if model else ""
        super().__init__(
            f"weights-fidelity gate: {family}{named} layer {layer} {field}: the normalized weights give relative "
            f"error {relative_error:.3g} against the model's own output (tolerance {tolerance:.1g}); the "
            f"{family} adapter misses a feature of this model (rope scaling, a bias, a norm variant) or its "
            f"parameters were edited after loading without a trace, so no bound is computed; load the model again, "
            f"and if the error stays report the model's config to attnsens"
        )
