"""Inverse-length influence of a nonfinal token (docs/math.md §10): certified C/n and measured decay.

import attnsens as A
model = A.influence.builtin_lnfree()                # also A.models.load("builtin:lnfree")
cert = A.influence.certified_constant(model)         # ‖Δy_n‖₂ ≤ C/n, C = 10**cert.log10_constant
df = A.influence.measure(model, lengths=[16, 64, 256, 1024])
fit = A.influence.fit_loglog_slope(df)               # slope ≈ −1 where the theorem applies
"""

from __future__ import annotations

from attnsens.influence.certificate import InfluenceCertificate, certified_constant
from attnsens.influence.inputs import CertificateInputs, PositionBound, certificate_inputs
from attnsens.influence.measure import POSITION_KINDS, measure
from attnsens.influence.slope import SlopeFit, fit_loglog_slope
from attnsens.models.builtin import LNFREE_CONFIG, builtin_lnfree, load_builtin_lnfree  # the theorem's own model

__all__ = [
    "LNFREE_CONFIG",
    "POSITION_KINDS",
    "CertificateInputs",
    "InfluenceCertificate",
    "PositionBound",
    "SlopeFit",
    "builtin_lnfree",
    "certificate_inputs",
    "certified_constant",
    "fit_loglog_slope",
    "load_builtin_lnfree",
    "measure",
]
