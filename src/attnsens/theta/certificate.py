"""Certified θ(p) intervals for attention rows: ``certify`` and the ``ThetaCertificate`` it returns.

θ of the stored row p (s = Σ p_i, not renormalised): θ = s − 4·d*², d* = min_S |p(S) − s/2|, which equals
4·max_S p(S)(1 − p(S)) when s = 1 and τ·‖J_softmax(u/τ)‖_{∞→1} for p = softmax(u/τ) (docs/math.md §2.3, T1).
Computing d* is number partitioning (docs/math.md T2(e)), so every row gets a rigorous float64 interval from the
sort-free cascade of docs/theta-algorithms.md §3, exact wherever a stage proves the optimum.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Literal

import einops
import numpy as np
import torch

from attnsens._memory import physical_memory
from attnsens._threads import keep_torch_threads
from attnsens.errors import ConfigError, ShapeError
from attnsens.theta._enclosure import theta_enclosure
from attnsens.theta._validation import check_tensor, raise_for_status, row_status
from attnsens.theta.methods import ThetaMethod

Precision = Literal["float32", "float64"]
Backend = Literal["auto", "numba", "torch", "triton"]

STOP_DISTANCE = {"float32": 2.0**-13.5 * (1.0 - 2.0**-12), "float64": 2.0**-28}
"""Refinement stops once d ≤ this: then 4d² is below half an ulp of θ ≈ 1 in that format
(docs/theta-algorithms.md §1). The float32 distance sits a relative 2^-12 below 2^-13.5, so that 4d² leaves
2^-25·(1 − (1 − 2^-12)²) ≈ 1.5·10^-11 of room for what the interval adds to it when sums carry rounding (2E + 8dE,
E = (2n + 16)·u·ŝ: about 7·10^-12 at n = 16,384 keys) and for its outward rounding: the width stays ≤ 2^-25.
At 2^-13.5 itself a 428-key SmolLM2 row came out at 2^-25 + 1.8·10^-13."""

MITM_MAX_SUPPORT = 24
EXACT_SUPPORT_MAX = 48
"""Largest ``exact_support`` of ``certify`` (and the enumeration limit of ``exact``): meet-in-the-middle over up to
2^24 sums a half, 0.5 GiB of buffers a thread and up to about 0.25 s a row on one core."""
CKK_NODE_BUDGET = 20_000
CKK_MAX_SUPPORT = 2048
MAX_TOLERANCE = 1.0
"""Largest accepted ``tolerance``: rows with 0 ≤ s ≤ 2, where θ = s − 4·d*² keeps its meaning and radii stay finite."""
ENUMERATION_MEMORY_SHARE = 0.5
"""Share of the machine's physical memory that one call's enumeration workspaces may take (one a thread, 0.5 GiB
each at ``exact_support=48``): where every thread's would exceed it, the call runs on fewer threads
(``enumeration_threads``), so that a many-core machine with less memory a core is not driven out of memory."""
PARALLEL_MIN_ELEMENTS = 1 << 16
PARALLEL_MIN_ROWS = 64
"""Batches of fewer elements and fewer rows run on one thread: waking numba's thread pool costs more than
certifying them. A batch of as many rows runs on the pool whatever its element count: rows of 25–48 keys cost up
to milliseconds each in their exact proofs (the first rows of a causal chunk are such rows)."""


@dataclass(frozen=True)
class ThetaCertificate:
    """Per-row certified enclosure of θ(p) = s − 4·d*², all tensors with the leading shape of p.

    Attributes:
        lower, upper: float64 bounds with lower ≤ θ ≤ upper for the real-number θ of the stored values,
            always (rounding included).
        exact: bool; the optimal bisection d* is proved, and [lower, upper] is the float64 enclosure of that
            one real number: width ≤ 2^-49·max(1, s) when the row's sums are error-free in float64:
            s ≤ 2^52·q for q the lowest set bit over the row, whatever its dtype (float32, float16 and bfloat16
            rows try the ulp 2^(e − 24) of their smallest positive value m·2^e first, and the lowest set bit
            where that fails: [0.5, 0.5 − 2^-24, 2^-30] in float32 has q = 2^-30), e.g. every float32 row with
            p_min ≥ 2^-29, or tiny rows (s < 2^-900, enclosed as [s − s², s] directly); otherwise width
            ≤ (16·d* + 4)·E + 2^-49·max(1, s) with E ≤ (2n + 16)·2^-53·s the rounding radius (n = support size).
        method: int8 ``ThetaMethod`` code of the stage where refinement stopped.
        row_sum: float64 computed row sum s (of the normalised row when ``normalize=True``).
        p_max: float64 largest stored value.

    >>> import torch
    >>> cert = certify(torch.tensor([0.5, 0.5]))
    >>> float(cert.lower), float(cert.upper), bool(cert.exact)
    (1.0, 1.0, True)
    """

    lower: torch.Tensor
    upper: torch.Tensor
    exact: torch.Tensor
    method: torch.Tensor
    row_sum: torch.Tensor
    p_max: torch.Tensor

    def __post_init__(self) -> None:
        shapes = {f.name: tuple(getattr(self, f.name).shape) for f in fields(self)}
        if len(set(shapes.values())) != 1:
            raise ShapeError(f"ThetaCertificate fields must share one shape, got {shapes}")

    @property
    def shape(self) -> torch.Size:
        """Leading shape of the certified tensor (its shape without the key axis)."""
        return self.lower.shape

    @property
    def width(self) -> torch.Tensor:
        """upper − lower (float64): 0 up to rounding on exact rows."""
        return self.upper - self.lower

    @property
    def dominant(self) -> torch.Tensor:
        """Rows whose largest atom holds at least half the mass (p_max ≥ s/2): θ = s − (2p_max − s)² exactly."""
        return 2.0 * self.p_max >= self.row_sum

    def method_names(self) -> list[str]:
        """``ThetaMethod`` names of the flattened rows (for reports and tables)."""
        return [ThetaMethod(int(code)).name for code in self.method.flatten().tolist()]

    def __getitem__(self, index: object) -> ThetaCertificate:
        """The certificate of a subset of rows, indexed like the leading shape."""
        return ThetaCertificate(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def __len__(self) -> int:
        return len(self.lower)

    def __repr__(self) -> str:
        """One line: shape, range of the lower bounds, exact fraction, widest interval (never the tensors)."""
        n_rows = self.lower.numel()
        summary = f"shape={tuple(self.shape)}"
        if n_rows > 0:
            lower = self.lower.detach().flatten()
            summary += (
                f", lower∈[{float(lower.min()):.9g}, {float(lower.max()):.9g}], "
                f"exact={float(self.exact.float().mean()):.1%}, max_width={float(self.width.max()):.3g}"
            )
        return f"ThetaCertificate({summary}, device={self.lower.device.type})"

    def to_pandas(self, axes: tuple[str, ...] | None = None):  # -> pandas.DataFrame
        """One record per row: its index along each leading axis, then theta_lower, theta_upper, theta_exact,
        theta_method (int8 ``ThetaMethod`` code), row_sum, p_max and dominant, named as in the audit's rows table.

        Args:
            axes: names of the leading axes; default the last ``ndim`` of ``("batch", "head", "query")`` (a
                [batch, head, query, key] attention tensor), ``axis_0, axis_1, …`` beyond three.

        >>> import torch
        >>> table = certify(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]])).to_pandas()
        >>> table[["head", "query", "theta_lower", "theta_exact"]]
           head  query  theta_lower  theta_exact
        0     0      0         1.00         True
        1     0      1         0.75         True
        """
        import pandas as pd

        ndim = len(self.shape)
        if axes is None:
            axes = ("batch", "head", "query")[3 - ndim :] if ndim <= 3 else tuple(f"axis_{i}" for i in range(ndim))
        if len(axes) != ndim:
            raise ShapeError(
                f"got {len(axes)} axis names for the {ndim} leading axes {tuple(self.shape)}; name each of them"
            )
        index = np.indices(tuple(self.shape)).reshape(ndim, -1) if ndim > 0 else np.zeros((0, 1), dtype=np.int64)
        columns = {name: index[i] for i, name in enumerate(axes)}
        values = {
            "theta_lower": self.lower,
            "theta_upper": self.upper,
            "theta_exact": self.exact,
            "theta_method": self.method,
            "row_sum": self.row_sum,
            "p_max": self.p_max,
            "dominant": self.dominant,
        }
        columns.update({name: tensor.detach().flatten().cpu().numpy() for name, tensor in values.items()})
        return pd.DataFrame(columns)


def certify(
    p: torch.Tensor,
    dim: int = -1,
    *,
    precision: Precision = "float32",
    exact_support: int | None = None,
    normalize: bool = False,
    tolerance: float | None = None,
    backend: Backend = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> ThetaCertificate:
    """Certified interval for θ(p) = s − 4·min_S (p(S) − s/2)² of every attention row of ``p`` along ``dim``.

    Zero entries are masked keys (causal rows are zero-padded rows). The stored values are certified as they
    are (s need not be 1); ``normalize=True`` certifies the float64 row fl(p_i / s) instead.

    Args:
        p: [..., key, ...] float16/bfloat16/float32/float64 probabilities, key axis ``dim``, on any device.
        precision: "float32" stops refining at d ≤ 2^-13.5·(1 − 2^-12) (θ fixed to float32 resolution, width
            ≤ 2^-25 on rows of up to 16,384 keys),
            "float64" at d ≤ 2^-28.
        exact_support: every row with at most this many non-zeros is proved exact, by meet-in-the-middle where
            the cheaper proofs do not settle it (``MITM_MAX_SUPPORT`` = 24 up to ``EXACT_SUPPORT_MAX`` = 48).
            Default None: rows of up to 24 non-zeros (26 on the CPU) are enumerated, and rows of up to 48 get
            the proofs that cost microseconds (cardinality bounds, a perfect split found by a short search); the
            others end at ``precision``. Enumeration costs up to 2^(n/2) sums a half, fewer where the values span
            many binades: on real rows of 45–48 keys, one core, a median of 7 ms (SmolLM2) and 42 ms (the tiny
            GPT's near-uniform rows), at most about 0.25 s, with 0.5 GiB of buffers per thread
            (docs/theta-algorithms.md §5); 48 made certify on real attention 13–18 times slower. Where every
            thread's buffers would take more than half the physical memory, fewer threads run
            (``ENUMERATION_MEMORY_SHARE``), with a note on stderr.
        normalize: renormalise each row by its float64 sum instead of checking it.
        tolerance: largest accepted |s − 1| when ``normalize`` is False, at most ``MAX_TOLERANCE`` = 1; default
            ``default_sum_tolerance(p.dtype)`` (1e-3 for float32/float64, 2^-9 for float16, 2^-6 for bfloat16).
        backend: "auto" (triton on CUDA tensors and numba on CPU tensors when importable, torch otherwise),
            "numba", "torch" or "triton" (CUDA tensors; CPU tensors under ``TRITON_INTERPRET=1``).
        progress: called as ``progress(rows done, rows)`` after each of about ``PROGRESS_BLOCKS`` blocks of rows,
            which are then certified one after the other (the same results; for displays of long calls).

    Returns:
        ThetaCertificate on the device of ``p`` with lower ≤ θ ≤ upper for every row (docs/theta-algorithms.md §1,
        §3; docs/math.md T1–T2).

    Raises:
        InputError: NaN/Inf, negative entries, empty rows, or |s − 1| > tolerance (names the row and the fix).
        ConfigError: tolerance outside [0, 1], or exact_support outside [24, 48].

    >>> certify(torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1]), exact_support=48).exact.item()
    True
    """
    if precision not in STOP_DISTANCE:
        raise ConfigError(f"precision={precision!r} is not one of {sorted(STOP_DISTANCE)}")
    mitm_max_support = enumeration_support(exact_support)
    cert, _ = run_cascade(
        p, dim, stop_distance=STOP_DISTANCE[precision], mitm_max_support=mitm_max_support,
        ckk_node_budget=CKK_NODE_BUDGET, ckk_max_support=CKK_MAX_SUPPORT, normalize=normalize,
        tolerance=tolerance, backend=backend, progress=progress,
    )  # fmt: skip
    return cert


def enumeration_support(exact_support: int | None) -> int:
    """The enumeration limit of the cascade for ``certify``'s ``exact_support`` (None: ``MITM_MAX_SUPPORT``).

    Raises:
        ConfigError: not an integer in [``MITM_MAX_SUPPORT``, ``EXACT_SUPPORT_MAX``].
    """
    if exact_support is None:
        return MITM_MAX_SUPPORT
    if isinstance(exact_support, bool) or not isinstance(exact_support, int):
        raise ConfigError(f"exact_support={exact_support!r} must be an integer number of non-zero keys")
    if not MITM_MAX_SUPPORT <= exact_support <= EXACT_SUPPORT_MAX:
        raise ConfigError(
            f"exact_support={exact_support} must lie in [{MITM_MAX_SUPPORT}, {EXACT_SUPPORT_MAX}]: rows of up to "
            f"{MITM_MAX_SUPPORT} non-zeros are always exact, and above {EXACT_SUPPORT_MAX} the enumeration needs "
            "more than 0.5 GiB and seconds a row (use exact(p) for a proof by CKK on longer rows)"
        )
    return exact_support


def default_sum_tolerance(dtype: torch.dtype) -> float:
    """Default largest accepted |s − 1| of rows stored in ``dtype``: max(10^-3, 4u), u its unit roundoff.

    Rounding each entry to ``dtype`` moves the row sum by up to u·s, and a softmax evaluated in ``dtype`` by a few
    u more, so real bfloat16 (u = 2^-8) and float16 (u = 2^-11) attention rows sum to 1 only within a few u. The
    tolerance only decides which rows are accepted: the certificate is for the stored values whatever their sum.

    >>> [default_sum_tolerance(dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)]
    [0.015625, 0.001953125, 0.001]
    """
    if not dtype.is_floating_point:
        return 1e-3
    return max(1e-3, 4 * torch.finfo(dtype).eps / 2)


def run_cascade(
    p: torch.Tensor,
    dim: int,
    *,
    stop_distance: float,
    mitm_max_support: int,
    ckk_node_budget: int,
    ckk_max_support: int,
    normalize: bool,
    tolerance: float | None,
    backend: Backend,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[ThetaCertificate, torch.Tensor]:
    """Validate, flatten to [row, key], run one backend (block by block with ``progress``, see ``certify``), raise
    for invalid rows, and enclose θ. ``tolerance`` None: ``default_sum_tolerance`` of p's dtype.

    Returns the certificate and the float64 point value fl(ŝ − 4·d̂²) of the best subset found (leading shape).
    """
    p = check_tensor(p, dim).detach()
    if tolerance is None:
        tolerance = default_sum_tolerance(p.dtype)
    if not 0 <= tolerance <= MAX_TOLERANCE:
        raise ConfigError(f"tolerance={tolerance} must lie in [0, {MAX_TOLERANCE:g}]: beyond |s − 1| ≤ 1 a row is "
                          "not an attention row at all (its sum may be anything); pass normalize=True to certify "
                          "the renormalised rows instead")  # fmt: skip
    kernels = _select_backend(backend, p.device)
    moved = p.movedim(dim, -1)
    leading = tuple(moved.shape[:-1])
    rows = einops.rearrange(moved, "... key -> (...) key")
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.to(torch.float32)
    if normalize:
        status, sums = row_status(rows, check_sum=False, tolerance=tolerance)
        raise_for_status(status, rows, leading, dim, tolerance)
        rows = rows.to(torch.float64) / sums.unsqueeze(-1)

    def cascade(sub: torch.Tensor, cpu_kernels: ModuleType | None = kernels) -> dict[str, torch.Tensor]:
        if cpu_kernels is None:
            from attnsens.theta._torch_path import certify_rows_torch

            return certify_rows_torch(sub, stop_distance, mitm_max_support, not normalize, tolerance)
        return _certify_rows_numba(cpu_kernels, sub, stop_distance, mitm_max_support, ckk_node_budget,
                                   ckk_max_support, not normalize, tolerance)  # fmt: skip

    gpu = _triton_kernels() if _uses_triton(backend, p.device) else None

    def run(sub: torch.Tensor) -> dict[str, torch.Tensor]:
        if gpu is not None:
            on_cpu = functools.partial(cascade, cpu_kernels=_numba_kernels())
            return gpu.certify_rows_triton(sub, stop_distance, mitm_max_support, not normalize, tolerance, on_cpu)
        return cascade(sub)

    numba_used = kernels is not None or gpu is not None  # the GPU path settles some rows on the CPU
    out = run(rows) if progress is None else _in_blocks(run, rows, progress, hold_workspaces=numba_used)
    raise_for_status(out["status"], rows, leading, dim, tolerance)

    lower, upper = theta_enclosure(out["row_sum"], out["d_found"], out["d_lb"], out["err"])
    exact = EXACT_BY_METHOD.to(out["method"].device)[out["method"].long()]
    columns = {
        "lower": lower, "upper": upper, "exact": exact, "method": out["method"],
        "row_sum": out["row_sum"], "p_max": out["p_max"],
    }  # fmt: skip
    cert = ThetaCertificate(**{k: v.reshape(leading).to(p.device) for k, v in columns.items()})
    point = out["row_sum"] - 4.0 * (out["d_found"] * out["d_found"])
    return cert, point.reshape(leading).to(p.device)


EXACT_BY_METHOD = torch.tensor([code in {m.value for m in ThetaMethod if m.is_exact} for code in range(128)])
"""Per method code (``ThetaMethod``, 0–127), whether that method proves lower == upper: a row's exact flag."""


@functools.cache
def _numba_kernels() -> ModuleType | None:
    """The compiled kernels, imported on first use (``import attnsens.theta`` never imports numba)."""
    try:
        from attnsens.theta import _numba_kernels as kernels
    except ImportError:
        return None
    return kernels


@functools.cache
def _triton_kernels() -> ModuleType | None:
    """The Triton kernel, imported on first use; None when triton is not importable."""
    try:
        from attnsens.theta import _triton_kernel as kernels
    except ImportError:
        return None
    return kernels


def _uses_triton(backend: Backend, device: torch.device) -> bool:
    """Whether rows go to the Triton kernel: asked for explicitly, or "auto" on a CUDA tensor with triton."""
    if backend != "triton":
        return backend == "auto" and device.type == "cuda" and _triton_kernels() is not None
    kernels = _triton_kernels()
    if kernels is None:
        raise ConfigError("backend='triton' requested but triton is not importable; install triton or use 'auto'")
    if not kernels.runs_on(device):
        raise ConfigError(f"backend='triton' cannot run on device {device}: use a CUDA tensor, set TRITON_INTERPRET=1 "
                          "before importing triton (CPU tensors), or use backend='auto'")  # fmt: skip
    return True


def _select_backend(backend: Backend, device: torch.device) -> ModuleType | None:
    if backend not in ("auto", "numba", "torch", "triton"):
        raise ConfigError(f"backend={backend!r} is not one of 'auto', 'numba', 'torch', 'triton'")
    if backend == "torch":
        return None
    if device.type != "cpu":
        if backend == "numba":
            raise ConfigError(f"backend='numba' needs a CPU tensor, got device {device}; use backend='auto'")
        return None
    kernels = _numba_kernels()
    if kernels is None and backend == "numba":
        raise ConfigError("backend='numba' requested but numba is not importable; install numba or use 'auto'")
    return kernels


PROGRESS_BLOCKS = 20
"""Blocks of rows a call with ``progress`` is cut into, each of at least ``PARALLEL_MIN_ROWS`` rows."""


def _in_blocks(
    run: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    rows: torch.Tensor,
    progress: Callable[[int, int], None],
    *,
    hold_workspaces: bool,
) -> dict[str, torch.Tensor]:
    """``run(rows)`` block by block, calling ``progress`` after each; the per-row outputs concatenated. Each row's
    certificate depends on that row alone, so the blocks change nothing but when ``progress`` is called. With
    ``hold_workspaces`` the numba blocks share their enumeration workspaces (faulted in once, not once a block)."""
    n_rows = rows.shape[0]
    block = max(PARALLEL_MIN_ROWS, -(-n_rows // PROGRESS_BLOCKS))
    parts = []
    hold: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if hold_workspaces:
        from attnsens.theta._numba_kernels import holding_workspaces

        hold = holding_workspaces()
    with hold:
        for start in range(0, n_rows, block):
            parts.append(run(rows[start : start + block]))
            progress(min(start + block, n_rows), n_rows)
    if not parts:
        return run(rows)
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def _certify_rows_numba(
    kernels: ModuleType,
    rows: torch.Tensor,
    stop_distance: float,
    mitm_max_support: int,
    ckk_node_budget: int,
    ckk_max_support: int,
    check_sum: bool,
    tolerance: float,
) -> dict[str, torch.Tensor]:
    from numba import get_num_threads

    from attnsens._numba_cache import note_compilation  # imports numba, loaded already with the kernels

    x = rows.contiguous().numpy()
    signed = np.dtype(f"int{8 * x.dtype.itemsize}")
    n_rows = x.shape[0]
    out = {name: torch.zeros(n_rows, dtype=torch.float64) for name in ("row_sum", "p_max", "d_found", "d_lb", "err")}
    out["method"] = torch.zeros(n_rows, dtype=torch.int8)
    out["status"] = torch.zeros(n_rows, dtype=torch.int8)
    parallel = x.size >= PARALLEL_MIN_ELEMENTS or n_rows >= PARALLEL_MIN_ROWS
    kernel = kernels.certify_rows_balanced if parallel else kernels.certify_rows_serial
    with keep_torch_threads():  # numba's first call into its pool resets the shared OpenMP thread count
        threads = get_num_threads() if parallel else 1
        threads = enumeration_threads(kernels.workspace_bytes(mitm_max_support, x.shape[1]), threads)
        args = (
            x, x.view(signed), signed.type(np.iinfo(signed).max), x.dtype.itemsize == 8, stop_distance,
            mitm_max_support, ckk_node_budget, ckk_max_support, check_sum, tolerance, out["row_sum"].numpy(),
            out["p_max"].numpy(), out["d_found"].numpy(), out["d_lb"].numpy(), out["err"].numpy(),
            out["method"].numpy(), out["status"].numpy(),
            kernels.thread_workspaces(mitm_max_support, x.shape[1], threads),
        )  # fmt: skip
        note_compilation(
            kernels.certify_rows if parallel else kernels.certify_rows_serial, args, *_COMPILE_NOTES[x.dtype.itemsize]
        )
        with _numba_threads(threads) if parallel else contextlib.nullcontext():
            kernel(*args)
    return out


_COMPILE_NOTES = {
    4: ("attnsens' θ kernels for float32 rows", "one to two minutes"),
    8: (
        "attnsens' θ kernels for float64 rows (float64 tensors, normalize=True, the softmax Jacobian's norm)",
        "about a minute",
    ),
}
"""What ``note_compilation`` says when a call compiles the θ kernels, by the rows' item size: what compiles and the
time it took on two cores (``attnsens warmup``; docs/performance.md)."""


_NOTED_THREADS: set[tuple[int, int]] = set()


def enumeration_threads(per_thread: int, threads: int) -> int:
    """How many of ``threads`` may run, each holding an enumeration workspace of ``per_thread`` bytes, within
    ``ENUMERATION_MEMORY_SHARE`` of the physical memory (at least 1); says so on stderr, once per count, where
    that is fewer than ``threads``."""
    if per_thread == 0:
        return threads
    memory = physical_memory()
    allowed = max(1, min(threads, int(ENUMERATION_MEMORY_SHARE * memory) // per_thread))
    if allowed < threads and (threads, allowed) not in _NOTED_THREADS:
        _NOTED_THREADS.add((threads, allowed))
        sys.stderr.write(
            f"note: exact enumeration holds {per_thread / 2**20:,.0f} MiB a thread; {allowed} of {threads} threads "
            f"run, within {ENUMERATION_MEMORY_SHARE:.0%} of this machine's {memory / 2**30:,.1f} GiB\n"
        )
    return allowed


@contextlib.contextmanager
def _numba_threads(threads: int) -> Iterator[None]:
    """numba's parallel regions started from this thread use ``threads`` threads within the block."""
    from numba import get_num_threads, set_num_threads

    before = get_num_threads()
    if threads == before:
        yield
        return
    set_num_threads(threads)
    try:
        yield
    finally:
        set_num_threads(before)
