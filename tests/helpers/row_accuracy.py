"""The block-∞ norm of one-head causal attention on scalar tokens at 400 bits (mpmath)."""

from __future__ import annotations

import mpmath


def _exact_block_norm_1d(x, wq, wk, wv, wo, bq, bk, bv, tau) -> mpmath.mpf:
    """‖D MHA(X)‖ of causal one-head attention with d_model = d_head = 1 at 400 bits: with scalar tokens the
    block-∞ operator norm is the ∞-norm of the Jacobian, max_i Σ_m |∂y_i/∂x_m|."""
    with mpmath.workprec(400):
        x = [mpmath.mpf(v) for v in x]
        wq, wk, wv, wo, bq, bk, bv, tau = (mpmath.mpf(v) for v in (wq, wk, wv, wo, bq, bk, bv, tau))
        best = mpmath.mpf(0)
        for i in range(len(x)):
            keys = range(i + 1)
            q = wq * x[i] + bq
            k = [wk * x[j] + bk for j in keys]
            v = [wv * x[j] + bv for j in keys]
            u = [q * k[j] / tau for j in keys]
            top = max(u)
            w = [mpmath.exp(t - top) for t in u]
            p = [t / mpmath.fsum(w) for t in w]
            row = mpmath.mpf(0)
            for m in keys:
                du = [((wq * k[j] if i == m else 0) + (q * wk if j == m else 0)) / tau for j in keys]
                mean = mpmath.fsum(p[j] * du[j] for j in keys)
                row += abs(wo * (p[m] * wv + mpmath.fsum(p[j] * (du[j] - mean) * v[j] for j in keys)))
            best = max(best, row)
        return best
