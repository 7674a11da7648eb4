"""θ(p) engine: certified intervals for the balanced-mass factor of attention rows (docs/math.md §2.3, T1–T2).

    certify(p)                                ThetaCertificate per row: lower ≤ θ ≤ upper, exact flag, method
    exact(p)                                  proved-optimal θ (float64) or TooHardError
    softmax_jacobian_inf_to_one_norm(u, tau)  the same certificate for ‖J_softmax(u/τ)‖_{∞→1} = θ/τ

numba is imported on the first call that needs a compiled kernel, never at import time.
"""

from __future__ import annotations

from attnsens.theta.certificate import ThetaCertificate, certify
from attnsens.theta.exact import exact
from attnsens.theta.jacobian import softmax_jacobian_inf_to_one_norm
from attnsens.theta.methods import ThetaMethod

__all__ = ["ThetaCertificate", "ThetaMethod", "certify", "exact", "softmax_jacobian_inf_to_one_norm"]
