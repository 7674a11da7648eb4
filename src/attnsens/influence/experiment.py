"""The influence experiment: certificate, measurement and slope of one model, as one table (docs/math.md §10.5).

The table has the columns of the ``influence`` results table (attnsens.store.schema), one row per
(n, position kind), with the certified bound C/n beside the measured influence wherever a certificate applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnsens.errors import AttnsensError
from attnsens.influence.certificate import InfluenceCertificate, certified_constant, not_applicable
from attnsens.influence.input_set import LayerObservation, input_set_log10_constant, observe_layers
from attnsens.influence.measure import POSITION_KINDS, measure
from attnsens.influence.slope import SlopeFit, fit_loglog_slope
from attnsens.train.model import GPT

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, kw_only=True)
class InfluenceResult:
    """Certificate, per-(n, position kind) table with ``influence_upper_bound``, and the fitted log–log slope;
    where inputs were observed (``run_influence(observe=…)``), each block's measured norm, score oscillation and
    p_max·n, and the input-set constant they give (attnsens.influence.input_set)."""

    model: str
    certificate: InfluenceCertificate
    table: pd.DataFrame
    fit: SlopeFit
    observations: tuple[LayerObservation, ...] = ()
    input_set_log10_C: float | None = None

    def per_length(self) -> pd.DataFrame:
        """One row per n: worst position kind's influence and TV, and the certified bound (NaN where none)."""
        grouped = self.table.groupby("n", as_index=False).agg(
            influence=("influence_max", "max"),
            influence_median=("influence_median", "max"),
            certified_bound=("influence_upper_bound", "max"),
            tv=("tv_max", "max"),
        )
        grouped["n_times_influence"] = grouped["n"] * grouped["influence"]
        return grouped

    def summary(self) -> dict[str, Any]:
        """The ``--json`` payload: slope, CI, certified C (None when it overflows or does not apply), rows."""
        cert = self.certificate
        log10_c = cert.log10_constant if cert.applicable else None
        constant = None if log10_c is None or log10_c > 308 else 10.0**log10_c
        unmasked = cert.applicable and cert.masking == "unmasked" and cert.unembedding_spread is not None
        probability = cert.log10_probability_constant if unmasked else None
        n_star = cert.log10_length_for_probability_change(0.01) if unmasked else None
        return {
            "model": self.model,
            "slope": self.fit.slope,
            "slope_ci": list(self.fit.slope_ci),
            "certified_C": constant if cert.masking == "unmasked" else None,
            "log10_certified_C": log10_c,
            "applicable": cert.applicable,
            "masking": cert.masking,
            "reasons": list(cert.reasons),
            "indicative_log10_C": None if cert.applicable else cert.log10_constant,
            "input_set_log10_C": self.input_set_log10_C,
            "layers": self.layer_records(),
            "log10_probability_constant": probability,
            "n_star": {"eta": 0.01, "log10_n": n_star},
            "measured": [
                {
                    "n": int(row.n),
                    "influence": float(row.influence),
                    "certified_bound": float(row.certified_bound) if math.isfinite(row.certified_bound) else None,
                    "tv": float(row.tv),
                }
                for row in self.per_length().itertuples()
            ],
        }

    def layer_records(self) -> list[dict[str, Any]]:
        """Per block k: the certified recursion's A_k, log10 e^{2A_k} and bound on the block's input norm beside the
        observed A_k, input norm and median p_max·n (the observed ones None where no inputs were observed)."""
        observed = {o.layer: o for o in self.observations}
        cert = self.certificate
        records = []
        for index, bounds in enumerate(cert.layers):
            seen = observed.get(index)
            records.append(
                {
                    "layer": index,
                    "A_k": bounds.score_upper_bound,
                    "log10_weight_ratio": bounds.log_weight_ratio / math.log(10.0),
                    "input_norm_bound": cert.embedding_norm
                    if index == 0
                    else cert.layers[index - 1].hidden_norm_upper_bound,
                    "A_k_observed": None if seen is None else max(seen.observed.score_half_range),
                    "input_norm_observed": None if seen is None else seen.observed.hidden_norm,
                    "p_max_n_median": None if seen is None else seen.p_max_n_median,
                }
            )
        return records

    def write(self, out_dir: str | Path, *, run_id: str = "influence") -> Path:
        """Write the table as ``OUT/influence/<model>.parquet`` (schema ``influence``) and record it in the manifest."""
        from attnsens.store import Manifest

        frame = self.table.copy()
        frame.insert(0, "model", self.model)
        frame.insert(0, "run_id", run_id)
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model)
        return Manifest.open(out_dir).write_unit(
            f"influence/{slug}.parquet", frame, schema="influence", metadata=self.summary()
        )


def run_influence(
    model: Any,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    name: str | None = None,
    n_samples: int = 4,
    positions: Sequence[str] = POSITION_KINDS,
    seed: int = 0,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    observe: Sequence[Any] | None = None,
) -> InfluenceResult:
    """Certificate (or the reasons there is none), measured influence per length, and the log–log slope;
    ``progress(done, total)`` after each length measured. ``observe``: token tensors ``[batch, n]`` on which an
    attnsens GPT's block norms, score oscillations and p_max·n are measured, with the input-set constant they give
    (:mod:`attnsens.influence.input_set`; not a certificate)."""
    try:
        certificate = certified_constant(model)
    except AttnsensError as err:
        certificate = not_applicable(str(err))
    table = measure(
        model, lengths, n_samples=n_samples, positions=positions, seed=seed, batch_size=batch_size, progress=progress
    )
    table["influence_upper_bound"] = [
        certificate.influence_upper_bound(int(n)) if certificate.applicable else math.nan for n in table["n"]
    ]
    label = name or getattr(model, "name", None) or type(model).__name__
    observations: tuple[LayerObservation, ...] = ()
    input_set = None
    module = getattr(model, "module", model)
    if observe is not None and isinstance(module, GPT):
        observations = tuple(observe_layers(module, observe))
        input_set = input_set_log10_constant(certificate, observations)
    return InfluenceResult(
        model=label,
        certificate=certificate,
        table=table,
        fit=fit_loglog_slope(table),
        observations=observations,
        input_set_log10_C=input_set,
    )
