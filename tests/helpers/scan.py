"""The float32 ulp as the θ scan defines it, computed independently."""

from __future__ import annotations

import math


def reference_ulp_float32(value: float) -> float:
    return math.ldexp(1.0, math.frexp(value)[1] - 24) if value >= 2.0**-126 else 2.0**-149
