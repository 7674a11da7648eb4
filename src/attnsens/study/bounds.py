"""Certified bounds of a whole model, layer by layer and head by head, beside empirical estimates.

``bound_model(model, input_ids)`` first passes an adapter's normalized weights through the weights-fidelity gate
(``attnsens.models.fidelity``, on ``input_ids`` or on seeded probe tokens), then evaluates, for every layer, the
quantities of docs/math.md A4 and T4–T8 and returns a pandas DataFrame whose columns follow the ``bounds`` table of
``attnsens.store.schema`` (head = −1 rows hold layer-level quantities). Inputs come from the model adapter (the
gated forward pass) or, for bare ``LayerWeights``, from a residual stream propagated with the reference forward of
``attnsens.geometry.layers``.

Head rows: projection norms, Φ_h, θ̃_h and ``mha_local_jacobian_upper_bound`` = ‖W_O^{(h)}‖(‖W_V^h‖ + θ̃_h Φ_h/τ),
a certified bound of the Jacobian of head h's own contribution. Layer rows: the certified local bound of the whole
attention sublayer at its actual input (the best head combination, T4/T5; for pre-LN and parallel blocks the input is
N₁ of the block input evaluated in float64, the point at which the block's chain-rule bound uses the same attention
bound, so both columns rest on one computation), its length-independent Lipschitz
bound on the input ball (T5; for pre-LN the ball of radius ‖γ₁‖_∞ + ‖β₁‖_rms that every N₁ output lies in,
otherwise the ball through the actual input), the length-dependent bound obtained without θ (θ replaced by its
distribution-free bound n_keys/2 from ‖J‖_{∞→1} ≤ n ‖J‖_{∞→∞} ≤ n/(2τ)), the lower estimate of the attention
Jacobian norm at the actual input and tightness ratios; the FFN, T7 block, local block and residual-expansion
bounds; LayerNorm condition statistics (T6). All norms in the block-∞ convention named in the ``norm`` column.

Weight files (``attnsens bounds FILE.safetensors``) are read and written by ``attnsens.store.layer_weights``; the
reference forward that propagates a residual stream through bare ``LayerWeights`` is ``attnsens.geometry.stream``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from attnsens import geometry as G
from attnsens._rounding import add_up, div_up, mul_up, norm2_upper_bound
from attnsens.errors import InputError, RouterTieError
from attnsens.geometry.layers import attention_sublayer, synthetic_block_input
from attnsens.geometry.norms import Geometry
from attnsens.geometry.stream import layer_inputs_from_stream, with_residual_sums
from attnsens.models.fidelity import check_weights_fidelity
from attnsens.seeding import derived_generator
from attnsens.store.schema import BOUNDS
from attnsens.weights import AttentionWeights, LayerWeights


def _rms_upper_bound(X: Tensor) -> Tensor:
    """≥ ‖X‖_{∞,rms} over the tokens of ``X`` [batch, query, d_model] (one value for the whole tensor)."""
    return div_up(norm2_upper_bound(X).amax(), math.nextafter(math.sqrt(X.shape[-1]), 0.0))


def _head_upper_bound(w_o: float, w_v: float, sensitivity: float, tau: float) -> float:
    """‖W_O^(h)‖ (‖W_V^h‖ + sensitivity/τ), every step rounded up (the per-head column of the table)."""
    one = torch.tensor(sensitivity, dtype=torch.float64)
    return float(mul_up(add_up(div_up(one, tau), w_v), w_o))


def _attention_call(attention: AttentionWeights) -> Callable[[Tensor], Tensor]:
    return lambda x: attention_sublayer(x, attention)


def _length_dependent_upper_bound(local: G.MHALocalJacobianBounds, n_keys: int, tau: float) -> Tensor:
    norms = local.norms
    return (norms.w_o * (norms.w_v + n_keys / 2 * local.phi / tau).sum(dim=-1)).amax()


def _probe_queries(spaced: Tensor | None, row_bound: Tensor) -> Tensor | None:
    """The estimator's output tokens: half of them the rows whose certified bound is largest (where the bound is
    attained, so the tightness ratio compares like with like), the rest from the evenly spaced ``spaced``."""
    if spaced is None:
        return None
    n = spaced.numel()
    largest = row_bound.amax(dim=0).topk(min((n + 1) // 2, row_bound.shape[-1])).indices.cpu()
    others = spaced[~torch.isin(spaced, largest)]
    keep = min(n - largest.numel(), others.numel())
    picks = torch.linspace(0, others.numel() - 1, keep).round().long() if keep > 0 else torch.zeros(0, dtype=torch.long)
    return torch.unique(torch.cat([largest, others[picks]]))


def _layer_records(
    layer: LayerWeights,
    entry: dict[str, Tensor],
    *,
    geometry: Geometry,
    queries: Tensor | None,
    iterations: int,
    restarts: int,
    compare_placements: bool,
    key: tuple[Any, ...],
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    attn = layer.attention
    block_input = entry["block_input"].to(torch.float64)
    # One attention bound serves the MHA columns and the block's chain rule, at the point the chain rule uses; a
    # block with a branch beside its attention (Falcon-H1's Mamba) has no bound of its own: its attention alone.
    whole = layer.beside_attention is None
    if whole:
        block_local_bounds = G.block_local_jacobian_bounds(block_input, layer, geometry=geometry)
        local, x_attn = block_local_bounds.attention, block_local_bounds.attention_input
    else:
        local, x_attn = G.pre_norm_attention_local_jacobian_bounds(block_input, layer, geometry=geometry)
    if layer.attention_reads_stream:  # the attention reads the (exact) block input
        radius_rms = _rms_upper_bound(x_attn)
    else:
        radius_rms = G.norm_output_radius_rms(layer.norms()[0])
    lipschitz = G.mha_lipschitz_bounds(attn, radius_rms=radius_rms)
    queries = _probe_queries(queries, local.row_upper_bound)

    def estimate(f: Callable[[Tensor], Tensor], x: Tensor, estimator: str) -> float:
        # Each estimator draws its own stream keyed by (run, seed, step, layer): a resumed study repeats it exactly.
        generator = derived_generator(*key, layer.index, estimator, device=x_attn.device)
        return float(
            G.block_jacobian_norm_estimate(
                f, x, iterations=iterations, restarts=restarts, queries=queries, geometry=geometry, generator=generator
            ).amax()
        )

    attn_estimate = estimate(_attention_call(attn), x_attn, "attention")
    norms = local.norms
    gamma = layer.attn_norm.gamma if layer.attn_norm is not None else None
    beta = layer.attn_norm.beta if layer.attn_norm is not None else None
    head_rows = []
    for h in range(attn.n_head):
        theta_tilde = float(local.theta_tilde[:, h].amax())
        phi = float(local.phi[:, h].amax())
        w_q, w_k, w_v, w_oh = (float(t[h]) for t in (norms.w_q, norms.w_k, norms.w_v, norms.w_o_head))
        head_rows.append({
            "head": h, "w_q_spectral_norm": w_q, "w_k_spectral_norm": w_k, "w_v_spectral_norm": w_v,
            "w_o_spectral_norm": w_oh, "score_path_norm_product": w_q * w_k,
            "value_path_norm_product": float(norms.w_o) * w_v,
            "quartic_norm_product": float(norms.w_o) * w_q * w_k * w_v,
            "phi": phi, "theta_tilde": theta_tilde,
            "mha_local_jacobian_upper_bound": _head_upper_bound(w_oh, w_v, theta_tilde * phi, attn.tau),
            "mha_lipschitz_upper_bound": _head_upper_bound(w_oh, w_v, float(lipschitz.phi[h]), attn.tau),
        })  # fmt: skip

    d_model = attn.d_model
    sqrt_d = math.nextafter(math.sqrt(d_model), math.inf)
    if layer.placement == "pre":
        mlp_radius = mul_up(G.norm_output_radius_rms(layer.mlp_pre_norm()), sqrt_d)
    else:
        mlp_input = block_local_bounds.mlp_input  # the real MLP input lies within its radius of the float one
        mlp_radius = (
            mul_up(G.norm_output_radius_rms(layer.norms()[0]), sqrt_d) if layer.placement == "post"
            else add_up(norm2_upper_bound(mlp_input.value).amax(), mlp_input.radius.amax())
        )  # fmt: skip
    block_lipschitz, block_local, block_estimate = None, None, None
    if whole:
        radius_in = float(_rms_upper_bound(block_input)) if layer.attention_reads_stream else None
        block_lipschitz = float(G.block_lipschitz_upper_bound(layer, input_radius_rms=radius_in).upper_bound)
        block_local = float(block_local_bounds.upper_bound.amax())
        block_estimate = estimate(lambda z: G.block_forward(z, layer), block_input, "block")
    local_bound = float(local.upper_bound.amax())
    layer_row: dict[str, Any] = {
        "head": -1, "w_o_spectral_norm": float(norms.w_o),
        "ln_gain_max": None if gamma is None else float(gamma.abs().amax()),
        "ln_bias_max": None if beta is None else float(beta.abs().amax()),
        "input_radius": float(radius_rms) * (1.0 if geometry == "rms" else math.sqrt(d_model)),
        "theta_tilde": float(local.theta_tilde.amax()),
        "mha_local_jacobian_upper_bound": local_bound,
        "mha_local_paper_form_upper_bound": float(local.paper_form_upper_bound.amax()),
        "mha_lipschitz_upper_bound": float(lipschitz.upper_bound),
        "mha_length_dependent_upper_bound": float(_length_dependent_upper_bound(local, x_attn.shape[1], attn.tau)),
        "mha_jacobian_estimate": attn_estimate,
        "tightness_ratio": local_bound / attn_estimate if attn_estimate > 0 else None,
        "ffn_lipschitz_upper_bound": float(G.ffn_lipschitz_upper_bound(layer.mlp, radius_l2=mlp_radius)),
        "block_lipschitz_upper_bound": block_lipschitz,
        "block_jacobian_estimate": block_estimate,
        "residual_jacobian_upper_bound": block_local,
        "residual_jacobian_estimate": block_estimate,
    }  # fmt: skip
    ln_ratio_max = 1.0
    if layer.attn_norm is not None and layer.mlp_norm is not None:  # a missing norm counts 1 (BlockLipschitzBound)
        attn_norm, mlp_norm = layer.norms()
        entry = with_residual_sums(layer, entry)
        attn_norm_input = entry["attention_residual_sum"] if layer.placement == "post" else block_input
        condition = G.layernorm_condition(attn_norm_input.to(torch.float64), attn_norm)
        mlp_norm_input = entry["mlp_residual_sum"] if layer.placement == "post" else None
        ln_ratio_max = float(condition.ratio_max)
        if mlp_norm_input is not None:
            mlp_condition = G.layernorm_condition(mlp_norm_input.to(torch.float64), mlp_norm)
            ln_ratio_max *= float(mlp_condition.ratio_max)
        layer_row["ln_condition_fraction"] = float(condition.satisfied_fraction)
        layer_row["ln_contraction_ratio_median"] = float(condition.ratio_median)
        if compare_placements and whole and not layer.has_out_norms:  # out norms: no single rearrangement
            estimates = G.residual_jacobian_estimates(
                block_input,
                layer,
                iterations=iterations,
                queries=queries,
                generator=derived_generator(*key, layer.index, "placements", device=x_attn.device),
            )
            layer_row["pre_ln_residual_jacobian_estimate"] = float(estimates.pre_ln_estimate.amax())
            layer_row["post_ln_residual_jacobian_estimate"] = float(estimates.post_ln_estimate.amax())
            layer_row["branch_jacobian_estimate"] = float(estimates.pre_ln_branch_estimate.amax())
    branch = math.nan if block_local is None else block_local - 1.0
    return [*head_rows, layer_row], {"ln_ratio_max": ln_ratio_max, "branch_upper_bound": branch}


def _placement_label(layer: LayerWeights) -> str:
    """The ``norm_placement`` column: pre_ln, post_ln, deepnorm or none, and for norms after the sublayers
    sandwich (with pre-norms, Gemma 2/3) or post_sublayer (without, OLMo 2)."""
    if layer.has_out_norms:
        return "sandwich" if layer.placement == "pre" else "post_sublayer"
    if layer.placement == "post":
        return "deepnorm" if layer.residual_scale != 1.0 else "post_ln"
    return "pre_ln" if layer.placement == "pre" else layer.placement


def _gathered(mine: dict[int, Any]) -> dict[int, Any]:
    """Every rank's layers of a bound shared out under torchrun, on every rank."""
    import torch.distributed as dist

    parts: list[dict[int, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {index: value for part in parts if part for index, value in part.items()}


def bound_model(
    model: Any,
    input_ids: Tensor | None = None,
    *,
    block_input: Tensor | None = None,
    geometry: str = "rms",
    seq_len: int = 32,
    n_queries: int | None = 8,
    iterations: int = 20,
    restarts: int = 1,
    compare_placements: bool = True,
    run_id: str = "bounds",
    model_name: str | None = None,
    step: int = 0,
    seed: int = 0,
    on_layer: Callable[[int], None] | None = None,
    shared: bool = False,
) -> pd.DataFrame:
    """Per layer and head: projection norms, Φ_h, θ̃_h, certified local and global bounds, estimates, ratios.

    Args:
        model: an adapter (``attnsens.models.load``) or a list of ``LayerWeights``.
        input_ids: ``[batch, n]`` token ids for an adapter (default: none; then ``block_input`` or synthetic).
        block_input: ``[batch, n, d_model]`` residual stream entering layer 0 (weights-only models; default: a
            seeded Gaussian stream of ``seq_len`` tokens with RMS 1 per token).
        geometry: ``"rms"`` or ``"l2"`` block-∞ convention of radii (operator norms agree).
        n_queries: output tokens probed by the estimators (half at the rows with the largest certified bound, the
            rest evenly spaced; None = all).
        iterations, restarts: estimator effort; compare_placements: also estimate pre- vs post-LN arrangements.
        run_id, step, seed: identifiers stored in every record; with the layer they also seed each estimator's
            own generator (``attnsens.seeding``), so the estimates never depend on torch's global generator.
        on_layer: called with each layer index when its records are done (progress display).
        shared: share the layers out among the ranks of the torchrun process group (below).

    With ``shared`` under torchrun (a process group of several ranks, every rank calling with the same model and
    inputs) each rank bounds one contiguous block of the layers, after the gate has run on every rank, and every
    rank returns the whole table, equal to one process's. Without it each rank bounds every layer itself (a study's
    ranks bound their own checkpoints).

    Returns:
        DataFrame with the ``bounds`` table's columns (docs/math.md A4, T4–T8); certified columns end in
        ``_upper_bound``.

    A layer whose MLP is a mixture of experts has local columns only (the MHA columns, the block's local bound at
    its input with the router's choice there): ``ffn_lipschitz_upper_bound`` and ``block_lipschitz_upper_bound``
    are infinite, since the MLP jumps where its choice changes (docs/math.md T7). A layer with a branch beside its
    attention that the weights do not model (Falcon-H1's Mamba-2 mixer, ``LayerWeights.beside_attention``) has its
    attention and FFN columns and no block columns. A hybrid's layers are its attention blocks alone
    (``LayoutAdapter.not_bounded``), and neither product column runs across them.

    Raises:
        WeightsFidelityError: an adapter's normalized weights do not reproduce the model's own blocks.
        RouterTieError: a mixture of experts whose router's choice is not certified at a token, naming the layer.
    """
    geometry_name = G.norms.check_geometry(geometry)
    from attnsens.study.finite import check_finite_layers, check_finite_module

    name: str = model_name or getattr(model, "name", None) or "layers"
    if not isinstance(model, list | tuple):
        check_finite_module(model.module, name=name)
    # An offloaded model's layers are read one at a time as they are asked for (models/offload.py): kept as is.
    layers = list(model) if isinstance(model, list | tuple) else model.layers
    if not layers:
        raise InputError("the model has no layers to bound; pass a model or a non-empty list of LayerWeights")
    check_finite_layers(layers, name=name)
    if not isinstance(model, list | tuple):
        # The gate: bounds of an adapter rest only on weights that reproduce the model (models/fidelity.py).
        checked = check_weights_fidelity(model, input_ids)
    if input_ids is not None and not isinstance(model, list | tuple):
        entries = [vars(e) for e in checked]
    else:
        if block_input is None:
            block_input = synthetic_block_input(layers[0].attention.d_model, seq_len)
        with torch.no_grad():
            entries = layer_inputs_from_stream(layers, block_input.to(torch.float64))
    n_tokens = entries[0]["block_input"].shape[1]
    queries = None if n_queries is None else torch.linspace(0, n_tokens - 1, min(n_queries, n_tokens)).round().long()
    from attnsens._ranks import rank_share, ranks

    rank, world = ranks() if shared else (0, 1)
    computed: dict[int, tuple[list[dict[str, Any]], dict[str, float], str]] = {}
    for index in rank_share(len(entries), rank, world):  # under torchrun each rank bounds one block of layers
        layer = layers[index]
        try:
            rows, extra = _layer_records(
                layer, entries[index], geometry=geometry_name, queries=queries, iterations=iterations,
                restarts=restarts, compare_placements=compare_placements, key=(run_id, seed, step),
            )  # fmt: skip
        except RouterTieError as err:  # the local bound of a mixture of experts needs a certified choice
            raise RouterTieError(f"layer {layer.index} of {name}: {err}") from None
        except torch.linalg.LinAlgError as err:
            raise InputError(
                f"layer {layer.index} of {name}: a norm or decomposition of its weights failed "
                f"({' '.join(str(err).split())[:120]}); check that layer's weights (degenerate or corrupted)"
            ) from None
        computed[index] = (rows, extra, layer.placement)
        for row in rows:
            row.update(run_id=run_id, model=name, step=step, seed=seed,
                       layer=layer.index, norm=f"block_{geometry}", norm_placement=_placement_label(layer))  # fmt: skip
        if on_layer is not None:
            on_layer(layer.index)
    if world > 1:
        computed = _gathered(computed)
    # A hybrid's layers are its attention blocks alone (LayoutAdapter.not_bounded): no product runs across them.
    whole_stack = isinstance(model, list | tuple) or model.not_bounded is None
    records, ln_ratios, branches = [], [], []
    for index in range(len(entries)):  # the chain-rule columns run over the layers in order
        rows, extra, placement = computed[index]
        records.extend(rows)
        if not whole_stack:
            continue
        ln_ratios.append(extra["ln_ratio_max"])
        branches.append(max(extra["branch_upper_bound"], 0.0))
        rows[-1]["ln_only_product_upper_bound"] = float(G.ln_only_product_upper_bound(torch.tensor(ln_ratios))[-1])
        if placement == "pre":
            rows[-1]["expansion_remainder_upper_bound"] = float(
                G.pre_ln_expansion_remainder_upper_bound(torch.tensor(branches))
            )
    return BOUNDS.frame(records)
