"""The Triton θ kernel under Triton's interpreter: soundness against exact rationals, agreement with the CPU cascade.

TRITON_INTERPRET=1 is set before triton is first imported, so the kernel runs on CPU tensors on every machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="triton is not installed: the GPU θ kernel is tested under its interpreter")

from attnsens.errors import ConfigError, InputError
from attnsens.theta import ThetaMethod, certify
from attnsens.theta import _triton_kernel as triton_kernel
from attnsens.theta._enclosure import theta_enclosure
from attnsens.theta._torch_path import _error_radius, _quantum
from tests.reference.theta_oracles import theta_fraction
from tests.unit.theta.rows import adversarial_rows, error_radius, softmax_rows, sums_error_free, with_zeros

if not triton_kernel.runs_on(torch.device("cpu")):
    pytest.skip("the Triton kernel was compiled before TRITON_INTERPRET=1 was set", allow_module_level=True)

SIGMAS = (0.5, 1.0, 2.0, 4.0, 8.0)
KERNEL_METHODS = {ThetaMethod.DOMINANT_ATOM, ThetaMethod.K_ATOM_RELAXATION, ThetaMethod.PERFECT_PARTITION,
                  ThetaMethod.PREFIX_BEST_FIT}  # fmt: skip


def causal_rows(length: int, sigma: float, *, seed: int, first: int = 0) -> torch.Tensor:
    """[length − first, length] float32 rows: row r sees keys 0…first + r (zero-padded tail), softmax(σ·z)."""
    z = torch.randn(length - first, length, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    visible = torch.arange(length)[None, :] <= torch.arange(first, length)[:, None]
    return torch.softmax(torch.where(visible, sigma * z, -torch.inf), -1).to(torch.float32)


def kernel_only(rows: torch.Tensor, *, stop_distance: float = 1.0) -> dict[str, torch.Tensor]:
    """The kernel's own numbers for every row (no exact fallback for small supports, nothing left open)."""

    def no_fallback(sub: torch.Tensor) -> dict[str, torch.Tensor]:
        raise AssertionError(f"{sub.shape[0]} rows were sent to the CPU cascade")

    return triton_kernel.certify_rows_triton(rows, stop_distance, 0, False, 0.0, finish=no_fallback)


def assert_sound(lower: float, upper: float, theta: Fraction, label: str) -> None:
    assert Fraction(lower) <= theta <= Fraction(upper), f"{label}: θ={float(theta)!r} ∉ [{lower!r}, {upper!r}]"


def assert_agrees_with_cpu(rows: torch.Tensor, labels: list[str], **kwargs: object) -> None:
    """Intervals overlap; rows both prove exact agree to the two enclosure widths; row data match."""
    gpu = certify(rows, backend="triton", **kwargs)
    cpu = certify(rows, backend="numba", **kwargs)
    assert torch.equal(gpu.p_max, cpu.p_max)
    torch.testing.assert_close(gpu.row_sum, cpu.row_sum, rtol=0, atol=2e-15 * rows.shape[-1])
    for i, label in enumerate(labels):
        lo_g, hi_g, lo_c, hi_c = (float(v[i]) for v in (gpu.lower, gpu.upper, cpu.lower, cpu.upper))
        assert lo_g <= hi_c and lo_c <= hi_g, f"{label}: [{lo_g!r}, {hi_g!r}] and [{lo_c!r}, {hi_c!r}] are disjoint"
        if bool(gpu.exact[i]) and bool(cpu.exact[i]):
            slack = (hi_g - lo_g) + (hi_c - lo_c)
            assert abs(lo_g - lo_c) <= slack and abs(hi_g - hi_c) <= slack, f"{label}: exact intervals differ"
        if int(gpu.method[i]) in KERNEL_METHODS and not bool(gpu.exact[i]):
            assert hi_g - lo_g <= 2.0**-25 * 1.01, f"{label}: kernel stage stopped above float32 resolution"


def test_softmax_rows_agree_with_cpu_cascade() -> None:
    blocks, labels = [], []
    for j, sigma in enumerate(SIGMAS):
        for length in (37, 251):
            rows = softmax_rows(4, length, sigma, seed=10 * j + length)
            blocks.append(torch.nn.functional.pad(rows, (0, 251 - length)))
            blocks.append(torch.nn.functional.pad(with_zeros(rows, 0.4, seed=j), (0, 251 - length)))
            labels += [f"σ={sigma} L={length}"] * 4 + [f"σ={sigma} L={length} zeros"] * 4
    rows = torch.cat(blocks)
    assert_agrees_with_cpu(rows, labels)
    cert = certify(rows, backend="triton")
    assert {ThetaMethod.DOMINANT_ATOM, ThetaMethod.PREFIX_BEST_FIT} <= {ThetaMethod(int(m)) for m in cert.method}


def test_causal_zero_padded_rows_agree_with_cpu_cascade() -> None:
    for sigma in (1.0, 4.0):
        rows = causal_rows(61, sigma, seed=int(sigma))
        assert_agrees_with_cpu(rows, [f"causal σ={sigma} row {r}" for r in range(rows.shape[0])])
        cert = certify(rows, backend="triton")
        assert bool(cert.exact[:24].all()), "rows with ≤ 24 keys are solved exactly (meet-in-the-middle on the device)"


@pytest.mark.parametrize("length", [1, 2])
def test_one_and_two_keys(length: int) -> None:
    rows = softmax_rows(6, length, 2.0, seed=length)
    assert_agrees_with_cpu(rows, [f"L={length} row {r}" for r in range(6)])
    got = kernel_only(rows)
    lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
    for i, row in enumerate(rows):
        assert_sound(float(lower[i]), float(upper[i]), theta_fraction(row.tolist()), f"L={length} row {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_stages_contain_exact_theta(dtype: torch.dtype) -> None:
    """With no small-support fallback and any stop distance, every kernel interval contains the exact rational θ."""
    blocks = [softmax_rows(6, 14, sigma, seed=j, dtype=dtype) for j, sigma in enumerate((0.25, *SIGMAS, 16.0))]
    blocks.append(with_zeros(softmax_rows(6, 14, 1.0, seed=99, dtype=dtype), 0.3, seed=5))
    rows = torch.cat(blocks)
    for stop_distance in (1.0, 2.0**-13.5):
        got = triton_kernel.certify_rows_triton(rows, stop_distance, 0, False, 0.0, finish=_cpu_numbers)
        lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
        for i, row in enumerate(rows):
            theta = theta_fraction(row.tolist())
            assert_sound(float(lower[i]), float(upper[i]), theta, f"row {i} stop={stop_distance}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adversarial_families_contain_exact_theta(dtype: torch.dtype) -> None:
    for length in (5, 16):
        families = adversarial_rows(length, seed=length)
        rows = torch.tensor(list(families.values()), dtype=dtype)
        got = kernel_only(rows)
        lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
        exact = {ThetaMethod.DOMINANT_ATOM, ThetaMethod.K_ATOM_RELAXATION, ThetaMethod.PERFECT_PARTITION}
        for i, (name, row) in enumerate(zip(families, rows, strict=True)):
            label = f"{name} L={length} {dtype}"
            assert_sound(float(lower[i]), float(upper[i]), theta_fraction(row.tolist()), label)
            if ThetaMethod(int(got["method"][i])) in exact:
                allowed = 2.0**-49 * max(1.0, float(got["row_sum"][i]))
                if not sums_error_free(row):
                    allowed += 8.0 * float(got["row_sum"][i]) * error_radius(row) + 8 * error_radius(row) ** 2
                assert float(upper[i] - lower[i]) <= allowed, f"{label}: exact row too wide"
        assert_agrees_with_cpu(rows, [f"{name} L={length}" for name in families], tolerance=1.0)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**12), min_size=12, max_size=12), min_size=1, max_size=8),
    st.integers(-30, 0),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_property_kernel_intervals_contain_theta_of_integer_rows(
    ints: list[list[int]], scale: int, dtype: torch.dtype
) -> None:
    """Rows of small integers over a power of two making s ∈ (2^scale / 2, 2^scale] (ties, zeros, perfect
    partitions, s ≤ 1 so that θ ≥ 0): every interval contains the exact θ."""
    rows = torch.tensor(ints, dtype=torch.float64)
    rows[:, 0] += 1.0
    rows = rows / 2.0 ** torch.ceil(torch.log2(rows.sum(-1, keepdim=True))) * 2.0**scale
    rows = rows.to(dtype)
    got = kernel_only(rows)
    lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
    for i, row in enumerate(rows):
        assert_sound(float(lower[i]), float(upper[i]), theta_fraction(row.tolist()), f"integer row {row.tolist()}")


def test_dominant_and_uniform_long_rows_closed_forms() -> None:
    """p_max ≥ s/2 ⇒ θ = s − (2p_max − s)² (exact, kernel stage); k equal atoms v ⇒ θ = k·v − (k mod 2)·v²."""
    tail = softmax_rows(5, 300, 1.0, seed=3, dtype=torch.float64)
    heavy = torch.tensor([0.5 + 1e-7, 0.6, 0.8, 0.95, 0.999], dtype=torch.float64)
    dominant = torch.cat([heavy.unsqueeze(-1), tail * (1 - heavy).unsqueeze(-1)], dim=-1)
    cert = certify(dominant, backend="triton")
    for i, row in enumerate(dominant):
        s = sum(Fraction(v) for v in row.tolist())
        assert_sound(float(cert.lower[i]), float(cert.upper[i]), s - (2 * Fraction(float(row[0])) - s) ** 2, "dom")
        assert int(cert.method[i]) == ThetaMethod.DOMINANT_ATOM and bool(cert.exact[i])

    length, rows, thetas = 509, [], []
    for k in (26, 27, 64, 101, 509):
        v = torch.tensor(1.0 / k, dtype=torch.float32)
        row = torch.zeros(length, dtype=torch.float32)
        row[torch.randperm(length, generator=torch.Generator().manual_seed(k))[:k]] = v
        rows.append(row)
        thetas.append(k * Fraction(float(v)) - (k % 2) * Fraction(float(v)) ** 2)
    cert = certify(torch.stack(rows), backend="triton", tolerance=1e-2)
    for i, theta in enumerate(thetas):
        assert_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"uniform row {i}")


def test_rows_with_a_rounding_level_relaxation_gap_closed_form() -> None:
    """A = B + C + r + 2δ over a tail of mass r: d* = δ (K-atom regime) even when δ ≤ E hides it from the proof.

    No top-8 interval contains t, so there is no fill target; the interval must still contain θ = s − 4δ² and be
    tight (the endpoint subsets {A}, {B, C} ∪ tail are at distance δ).
    """
    tail = [0.01 / 27] * 27
    rows, thetas = [], []
    for delta in (1e-16, 1e-15, 1e-13):
        values = [0.3 + 0.2 + sum(tail) + 2 * delta, 0.3, 0.2, *tail]
        rows.append(values)
        exact = [Fraction(v) for v in values]
        s, t, r = sum(exact), sum(exact) / 2, sum(exact[3:])
        tops = exact[:3]
        d_lb = min(max(p_t - t, t - p_t - r, Fraction(0))
                   for p_t in (sum(v for j, v in enumerate(tops) if mask >> j & 1) for mask in range(8)))  # fmt: skip
        assert d_lb > 0
        thetas.append(s - 4 * d_lb * d_lb)
    cert = certify(torch.tensor(rows, dtype=torch.float64), backend="triton", tolerance=1.0)
    for i, theta in enumerate(thetas):
        assert_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"δ row {i}")
        assert float(cert.width[i]) <= 1e-12


def test_planted_perfect_partitions_float64() -> None:
    """Dyadic float64 rows of equal pairs: d* = 0, θ = s; the exact-quantum path may prove it (E = 0)."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for _ in range(6):
        half = torch.randint(1, 2**20, (100,), generator=gen).to(torch.float64)
        ints = torch.cat([half, half])[torch.randperm(200, generator=gen)]
        rows.append(ints / 2.0 ** torch.ceil(torch.log2(ints.sum())))
    rows = torch.stack(rows)
    got = kernel_only(rows)
    assert bool((got["err"] == 0).all())
    lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
    for i, row in enumerate(rows):
        assert_sound(float(lower[i]), float(upper[i]), sum(Fraction(v) for v in row.tolist()), f"planted row {i}")
    assert_agrees_with_cpu(rows, [f"planted row {i}" for i in range(6)], tolerance=1.0)


def test_error_radius_and_quantum_match_the_cpu_rounding_model() -> None:
    """E = 0 exactly on the rows the documented criterion ŝ ≤ 2^52·q calls error-free, else the same formula."""
    dyadic = torch.randint(1, 2**16, (3, 40), generator=torch.Generator().manual_seed(1)).to(torch.float64)
    tiny = softmax_rows(3, 40, 1.0, seed=2)
    tiny[:, 0] = 2.0**-40
    # ulp(p_min) = 2^-53 leaves ŝ > 2^52·q; the lowest set bit 2^-30 proves the sums error-free
    few_bits = torch.tensor([[0.5, 0.25] + [2.0**-30] * 38, [0.5, 0.125] + [2.0**-29] * 38], dtype=torch.float32)
    blocks = {
        torch.float64: [softmax_rows(3, 40, 1.0, seed=1, dtype=torch.float64), dyadic / 2.0**22],
        torch.float32: [softmax_rows(3, 40, 1.0, seed=3), tiny, few_bits],
    }
    for dtype, parts in blocks.items():
        rows = torch.cat(parts).to(dtype)
        got = kernel_only(rows)
        x = rows.to(torch.float64)
        positive = x > 0
        expected = _error_radius(
            x.sum(-1),
            positive.sum(-1),
            _quantum(x, positive, x.sum(-1), positive.sum(-1), exact_quantum=dtype == torch.float64),
        )
        assert torch.equal(got["err"] == 0, expected == 0)
        assert [sums_error_free(row) for row in rows] == (expected == 0).tolist()
        torch.testing.assert_close(got["err"], expected, rtol=1e-14, atol=0)


def test_normalize_and_float16_inputs_agree_with_cpu_cascade() -> None:
    rows = softmax_rows(8, 53, 2.0, seed=4) * 1.01
    assert_agrees_with_cpu(rows, [f"normalised row {i}" for i in range(8)], normalize=True)
    half = softmax_rows(8, 53, 2.0, seed=5).to(torch.float16)
    assert_agrees_with_cpu(half, [f"float16 row {i}" for i in range(8)], tolerance=1e-2)


def test_leading_shape_and_dim_are_kept() -> None:
    p = softmax_rows(3 * 5, 29, 1.0, seed=6).reshape(3, 5, 29).transpose(1, 2)
    cert = certify(p, dim=1, backend="triton")
    assert cert.shape == (3, 5)
    torch.testing.assert_close(cert.lower, certify(p, dim=1, backend="numba").lower, rtol=0, atol=2.0**-25)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inside the interpreter, on NaN/inf/overflowing rows
@pytest.mark.parametrize("kind", ["nan", "inf", "overflow", "negative", "empty", "sum"])
def test_invalid_rows_raise_the_cpu_messages(kind: str) -> None:
    rows = softmax_rows(4, 30, 1.0, seed=8, dtype=torch.float64)
    if kind == "empty":
        rows[2] = 0.0
    elif kind == "overflow":
        rows[2, 7:9] = 1e308
    else:
        rows[2, 7] = {"nan": float("nan"), "inf": float("inf"), "negative": -0.1, "sum": rows[2, 7] + 0.5}[kind]
    messages = []
    for backend in ("triton", "numba"):
        with pytest.raises(InputError) as info:
            certify(rows, backend=backend)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_backend_selection() -> None:
    from attnsens.theta.certificate import _uses_triton

    with pytest.raises(ConfigError, match="backend"):
        certify(torch.tensor([0.5, 0.5]), backend="cuda")  # type: ignore[arg-type]
    assert not _uses_triton("auto", torch.device("cpu"))
    assert _uses_triton("auto", torch.device("cuda"))
    assert _uses_triton("triton", torch.device("cpu"))
    assert not _uses_triton("torch", torch.device("cuda"))


def test_meta_soundness_check_catches_a_wrong_kernel() -> None:
    """A kernel that measures distances to 1/2 instead of s/2 fails the exact-rational soundness check."""
    rows = softmax_rows(6, 14, 1.0, seed=11) * 1.001
    got = kernel_only(rows)
    shifted = got["d_found"] - (got["row_sum"] - 1.0).abs() / 2
    lower, upper = theta_enclosure(got["row_sum"], shifted.abs(), shifted.abs(), got["err"])
    with pytest.raises(AssertionError):
        for i, row in enumerate(rows):
            assert_sound(float(lower[i]), float(upper[i]), theta_fraction(row.tolist()), f"row {i}")


def _cpu_numbers(sub: torch.Tensor) -> dict[str, torch.Tensor]:
    from attnsens.theta.certificate import _certify_rows_numba, _numba_kernels

    return _certify_rows_numba(_numba_kernels(), sub, 2.0**-13.5, 24, 20_000, 2048, False, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("length", [1024, 4093])
def test_long_rows_agree_with_cpu_cascade(length: int) -> None:
    per_sigma = 65_536 // length
    blocks = [softmax_rows(per_sigma, length, sigma, seed=j) for j, sigma in enumerate(SIGMAS)]
    blocks.append(causal_rows(length, 2.0, seed=1)[:: max(1, length // 256)])
    rows = torch.cat(blocks)
    assert_agrees_with_cpu(rows, [f"L={length} row {i}" for i in range(rows.shape[0])])


def test_launch_shapes_give_identical_rows() -> None:
    rows = torch.cat([softmax_rows(3, 45, sigma, seed=j) for j, sigma in enumerate(SIGMAS)])
    reference = triton_kernel.kernel_pass(rows, 2.0**-13.5, 24, True, 1e-3)
    for launch in ((1, 1), (4, 2)):
        got = triton_kernel.kernel_pass(rows, 2.0**-13.5, 24, True, 1e-3, launch)
        for name, value in reference.items():
            assert torch.equal(got[name], value), f"{name} differs with launch {launch}"


def test_rows_longer_than_the_register_limit_go_to_the_cpu_cascade(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = softmax_rows(5, 40, 1.0, seed=12)
    monkeypatch.setattr(triton_kernel, "MAX_KEYS", 32)
    gpu, cpu = certify(rows, backend="triton"), certify(rows, backend="numba")
    assert torch.equal(gpu.lower, cpu.lower) and torch.equal(gpu.method, cpu.method)


def test_float64_precision_and_no_rows() -> None:
    rows = torch.cat([softmax_rows(3, 40, sigma, seed=j) for j, sigma in enumerate(SIGMAS)])
    assert_agrees_with_cpu(rows, [f"float64 precision row {i}" for i in range(rows.shape[0])], precision="float64")
    assert certify(torch.empty(0, 7), backend="triton").shape == (0,)


def test_subnormal_rows_are_enclosed_on_the_triton_backend() -> None:
    """Three entries 2^-1074: s/2 is no float, and the exact flag once came with lower > θ (exact rationals)."""
    for row in ([2.0**-1074] * 3, [3 * 2.0**-1074, 2.0**-1073]):
        cert = certify(torch.tensor(row, dtype=torch.float64), backend="triton", tolerance=1.0)
        assert Fraction(float(cert.lower)) <= theta_fraction(row) <= Fraction(float(cert.upper))


def _real_early_rows() -> torch.Tensor:
    """The tiny GPT's early-training rows of 25–36 keys (the test fixture of ``test_real_rows``), whose exact θ the
    integer meet-in-the-middle oracle gives."""
    import numpy as np

    from tests.helpers.real_rows import FIXTURE, oracle_rows

    return oracle_rows(torch.from_numpy(np.load(FIXTURE)["rows"]))


def _certify_on_the_kernel(rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], set[int]]:
    """``certify_rows_triton`` at float32 precision, with the indices of the rows it sent to the CPU cascade."""
    from attnsens.theta.certificate import MITM_MAX_SUPPORT, STOP_DISTANCE, _certify_rows_numba, _numba_kernels

    sent: set[int] = set()

    def finish(sub: torch.Tensor) -> dict[str, torch.Tensor]:
        for row in sub:
            sent.add(int(torch.nonzero((rows == row).all(-1)).flatten()[0]))
        return _certify_rows_numba(_numba_kernels(), sub, STOP_DISTANCE["float32"], MITM_MAX_SUPPORT, 100_000,
                                   2048, True, 1e-3)  # fmt: skip

    out = triton_kernel.certify_rows_triton(rows, STOP_DISTANCE["float32"], MITM_MAX_SUPPORT, True, 1e-3, finish)
    return out, sent


def test_cardinality_stage_proves_real_rows_on_the_device() -> None:
    """Near-uniform real rows the fills leave open are proved by the cardinality bound on the device, hold the
    exact θ, and are not sent to the CPU."""
    from tests.helpers.real_rows import dyadic
    from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle

    rows = _real_early_rows()
    out, sent = _certify_on_the_kernel(rows)
    lower, upper = theta_enclosure(out["row_sum"], out["d_found"], out["d_lb"], out["err"])
    proved = torch.nonzero(out["method"] == int(ThetaMethod.CARDINALITY_BOUND)).flatten().tolist()
    on_device = [i for i in proved if i not in sent]
    assert len(on_device) >= 10, (len(proved), len(sent), len(rows))
    for i in on_device:
        theta = theta_dyadic_meet_in_the_middle(*dyadic(rows[i]))
        assert_sound(float(lower[i]), float(upper[i]), theta, f"real row {i}")
        assert float(upper[i] - lower[i]) <= 2.0**-45, f"real row {i}: the bound's endpoint is the optimum"


def test_meta_cardinality_stage_check_catches_a_wrong_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound one float32 quantum too high (a count's interval end off by one value's rounding) must fail."""
    original = triton_kernel._cardinality_bound
    monkeypatch.setattr(triton_kernel, "_cardinality_bound", lambda *args: original(*args) + 2.0**-24)
    with pytest.raises(AssertionError):
        test_cardinality_stage_proves_real_rows_on_the_device()


def test_short_rows_are_solved_exactly_on_the_device() -> None:
    """Rows of at most 24 keys (masked keys anywhere) get meet-in-the-middle on the device, never the CPU."""
    rows = torch.cat([with_zeros(softmax_rows(8, 24, sigma, seed=j), 0.3, seed=j) for j, sigma in enumerate(SIGMAS)])
    rows = torch.cat([rows, causal_rows(24, 1.0, seed=3)])

    def no_fallback(sub: torch.Tensor) -> dict[str, torch.Tensor]:
        raise AssertionError(f"{sub.shape[0]} rows of ≤ 24 keys were sent to the CPU cascade")

    got = triton_kernel.certify_rows_triton(rows, 2.0**-13.5, 24, False, 0.0, finish=no_fallback)
    lower, upper = theta_enclosure(got["row_sum"], got["d_found"], got["d_lb"], got["err"])
    for i, row in enumerate(rows):
        theta = theta_fraction(row.tolist())
        assert_sound(float(lower[i]), float(upper[i]), theta, f"row {i}")
    assert bool((got["method"] == int(ThetaMethod.MEET_IN_THE_MIDDLE)).all())
    assert torch.equal(got["d_found"], got["d_lb"]), "meet-in-the-middle is exact: d̂ = d̂_lb"


def test_device_exchanges_settle_long_rows_soundly() -> None:
    """Long rows handed to the device stages as open: the ones the exchanges settle end within float32
    resolution, inside the CPU cascade's interval."""
    rows = torch.cat([softmax_rows(12, 300, sigma, seed=40 + j) for j, sigma in enumerate((0.25, 0.5, 1.0))])
    stop = 2.0**-13.5
    out = triton_kernel.kernel_pass(rows, stop, 24, False, 0.0)
    out["method"].zero_()  # every row open: the kernel's own d̂ and d̂_lb stay, as after its launches
    open_rows = triton_kernel.device_stages(rows, torch.arange(rows.shape[0]), out, stop, 24)
    settled = torch.ones(rows.shape[0], dtype=torch.bool)
    settled[open_rows] = False
    swapped = out["method"] == int(ThetaMethod.SWAP_DESCENT)
    assert int(swapped.sum()) >= rows.shape[0] // 2
    lower, upper = theta_enclosure(out["row_sum"], out["d_found"], out["d_lb"], out["err"])
    cpu = certify(rows, backend="numba")
    for i in torch.nonzero(settled).flatten().tolist():
        assert lower[i] <= cpu.upper[i] and cpu.lower[i] <= upper[i], f"row {i}: disjoint from the CPU interval"
        assert float(upper[i] - lower[i]) <= 2.0**-25, f"row {i}"
    # A stop distance no exchange reaches: every row not proved stays open for the CPU.
    out = triton_kernel.kernel_pass(rows, 2.0**-60, 24, False, 0.0)
    out["method"].zero_()
    open_rows = triton_kernel.device_stages(rows, torch.arange(rows.shape[0]), out, 2.0**-60, 24)
    proved = {ThetaMethod.CARDINALITY_BOUND, ThetaMethod.PERFECT_PARTITION}
    assert bool((out["method"][open_rows] == 0).all())
    assert all(ThetaMethod(int(m)) in proved for m in out["method"] if m), "only proofs settle at this stop distance"
    assert open_rows.numel() > 0
