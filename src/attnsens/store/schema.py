"""Every results table attnsens writes: its columns, their Arrow dtypes and what each one means.

This module is the single source of truth for the results store. Writers validate against it
(``write_parquet(..., schema="rows")``), readers and the report rely on the column names below.

Conventions shared by all tables:

* Layers, heads, batch indices and query/key positions are 0-based.
* ``head = -1`` means "all heads of the layer pooled" (summary) or "a layer-level quantity" (bounds);
  ``layer = -1`` means "not tied to one layer" (gradient norms of embeddings, final norm, ...).
* ``step`` is the checkpoint (optimizer) step; a static, pretrained model is recorded as step 0.
* Entropy is in nats. Certified bounds end in ``_upper_bound`` / ``_lower_bound``, sampled or optimised
  values end in ``_estimate``, exact values have no suffix (docs/architecture.md, "Results name what they are").
* Norms are named: ``_spectral_norm`` is the matrix 2-norm; block norms carry the convention of the
  ``norm`` column of the bounds table (``"block_rms"`` or ``"block_l2"``, docs/math.md §2.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from attnsens.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column: name, Arrow dtype, whether nulls are allowed, and its meaning."""

    name: str
    dtype: pa.DataType
    doc: str
    nullable: bool = False


@dataclass(frozen=True, kw_only=True)
class TableSchema:
    """A results table: ordered columns plus the key columns that identify one record."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ConfigError(f"table {self.name!r} lists a column twice: {names}; give each column once")
        missing = [k for k in self.key if k not in names]
        if missing:
            raise ConfigError(f"table {self.name!r} has key columns {missing} that are not columns; fix the key")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise ConfigError(f"table {self.name!r} has no column {name!r}; known columns: {', '.join(self.names)}")

    def frame(self, records: list[dict[str, Any]]) -> pd.DataFrame:
        """``records`` as a DataFrame with exactly this table's columns, in order: a key that is not a column is
        refused (a misspelt field would otherwise be dropped on write), an absent nullable column is null, and a
        non-nullable column some record lacks is refused."""
        import pandas as pd

        known = set(self.names)
        unknown = sorted({key for record in records for key in record} - known)
        if unknown:
            raise ConfigError(f"records for table {self.name!r} carry fields that are not columns: {unknown}")
        frame = pd.DataFrame.from_records(records, columns=list(self.names))
        required = [c.name for c in self.columns if not c.nullable and frame[c.name].isna().any()]
        if records and required:
            raise ConfigError(f"records for table {self.name!r} lack the required columns {required}")
        return frame

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.dtype, nullable=c.nullable) for c in self.columns])


def _c(name: str, dtype: pa.DataType, doc: str, *, nullable: bool = False) -> Column:
    return Column(name=name, dtype=dtype, doc=doc, nullable=nullable)


def _f(name: str, doc: str) -> Column:
    """A float64 column that may be null (filled by whichever stage can compute it)."""
    return Column(name=name, dtype=pa.float64(), doc=doc, nullable=True)


_I8, _I32, _I64, _F64, _BOOL, _STR = pa.int8(), pa.int32(), pa.int64(), pa.float64(), pa.bool_(), pa.string()

_RUN_ID = _c("run_id", _STR, "identifier of the run (one training run, audit or experiment)")
_MODEL = _c("model", _STR, "model name or path as given by the user")
_STEP = _c("step", _I64, "checkpoint (optimizer) step; 0 for a static pretrained model")
_SEED = _c("seed", _I64, "training / sampling seed of the run")
_LAYER = _c("layer", _I32, "0-based layer index; -1 when not tied to one layer")

ROWS = TableSchema(
    name="rows",
    doc="One record per audited attention row p (docs/math.md §2.4, §9.5).",
    columns=(
        _RUN_ID,
        _MODEL,
        _STEP,
        _SEED,
        _LAYER,
        _c("head", _I32, "0-based head index (query head for grouped-query attention)"),
        _c("batch", _I32, "0-based index of the sequence in the evaluation batch"),
        _c("query", _I32, "0-based query position t of the row"),
        _c("n_keys", _I32, "number of allowed keys of the row (t + 1 under a causal mask)"),
        _c("row_sum", _F64, "s = Σ_i p_i of the stored row (float32 rows do not sum to exactly 1)"),
        _c("p_max", _F64, "largest attention weight max_i p_i"),
        _c("argmax", _I32, "0-based key position of p_max (0 = first token, detects attention sinks)"),
        _c("entropy", _F64, "Shannon entropy H(p) = −Σ p_i log p_i in nats"),
        _c("normalized_entropy", _F64, "H(p) / log n_keys in [0, 1]; 0 for single-key rows"),
        _c("n_eff", _F64, "effective number of keys 1 / Σ p_i²"),
        _c("theta_lower", _F64, "certified lower bound of θ(p) = 4 max_S p(S)(1 − p(S)) (docs/math.md A2)"),
        _c("theta_upper", _F64, "certified upper bound of θ(p)"),
        _c("theta_exact", _BOOL, "true when theta_lower == theta_upper is proved"),
        _c("theta_method", _I8, "code of the certificate method that produced theta_lower (attnsens.theta)"),
        _c("dominant", _BOOL, "dominant-atom row: p_max ≥ row_sum / 2, where θ = 4 p_max (1 − p_max) (T2(a))"),
        _c(
            "attention",
            _STR,
            "which attention of an encoder-decoder the layer is: encoder, decoder (self-attention) or cross "
            "(decoder queries, encoder keys); null for a model of one stack",
            nullable=True,
        ),
    ),
    key=("run_id", "step", "seed", "layer", "head", "batch", "query"),
)

SUMMARY = TableSchema(
    name="summary",
    doc=(
        "Aggregates of the rows table per (run_id, step, seed, layer, head), docs/math.md A3; "
        "head = -1 pools all heads of the layer. Built by attnsens.store.summary.summarize_rows."
    ),
    columns=(
        _RUN_ID,
        _MODEL,
        _STEP,
        _SEED,
        _LAYER,
        _c("head", _I32, "0-based head index, or -1 for all heads of the layer pooled"),
        _c("n_rows", _I64, "number of audited rows aggregated"),
        _c("theta_lower_median", _F64, "median over rows of theta_lower (T2(f): ≥ half the rows have θ ≥ it)"),
        _c("theta_lower_q10", _F64, "10th percentile of theta_lower"),
        _c("theta_lower_q25", _F64, "25th percentile of theta_lower"),
        _c("theta_lower_q75", _F64, "75th percentile of theta_lower"),
        _c("theta_lower_q90", _F64, "90th percentile of theta_lower"),
        _c("theta_upper_median", _F64, "median over rows of theta_upper"),
        _c("fraction_exact", _F64, "fraction of rows whose θ is proved exact"),
        _c("fraction_dominant", _F64, "fraction of dominant-atom rows (p_max ≥ row_sum / 2)"),
        _c("p_max_median", _F64, "median of p_max"),
        _c("p_max_mean", _F64, "mean of p_max"),
        _c("entropy_mean", _F64, "mean entropy in nats"),
        _c("normalized_entropy_mean", _F64, "mean of entropy / log n_keys"),
        _c("n_eff_mean", _F64, "mean effective number of keys 1 / Σ p_i²"),
    ),
    key=("run_id", "step", "seed", "layer", "head"),
)

BOUNDS = TableSchema(
    name="bounds",
    doc=(
        "Weight norms and certified bounds per (run_id, step, seed, layer, head), docs/math.md A4, T4–T8; "
        "head = -1 holds layer-level quantities (whole W_O, MHA, FFN, block, LayerNorm, residual Jacobian). "
        "Every numeric column may be null where it does not apply to the row's level or model."
    ),
    columns=(
        _RUN_ID,
        _MODEL,
        _STEP,
        _SEED,
        _LAYER,
        _c("head", _I32, "0-based head index, or -1 for a layer-level record"),
        _c("norm", _STR, "block norm convention of every bound in the record: 'block_rms' or 'block_l2'"),
        _c(
            "norm_placement",
            _STR,
            "residual block type: 'pre_ln', 'post_ln', 'deepnorm', 'none', 'sandwich' (pre-norms and norms after each "
            "sublayer: Gemma 2/3) or 'post_sublayer' (norms after each sublayer only: OLMo 2)",
            nullable=True,
        ),
        _f("w_q_spectral_norm", "‖W_Q^h‖_2 (head slice, d_head × d_model)"),
        _f("w_k_spectral_norm", "‖W_K^h‖_2"),
        _f("w_v_spectral_norm", "‖W_V^h‖_2"),
        _f("w_o_spectral_norm", "‖W_O^(h)‖_2 of the head block; the whole ‖W_O‖_2 when head = -1"),
        _f("score_path_norm_product", "‖W_Q^h‖_2 ‖W_K^h‖_2"),
        _f("value_path_norm_product", "‖W_O‖_2 ‖W_V^h‖_2"),
        _f("quartic_norm_product", "‖W_O‖_2 ‖W_Q^h‖_2 ‖W_K^h‖_2 ‖W_V^h‖_2 (docs/math.md T9)"),
        _f("ln_gain_max", "‖γ‖_∞ of the norm feeding the attention input"),
        _f("ln_bias_max", "‖β‖_∞ of that norm"),
        _f("input_radius", "input radius R of the bounded set, in the record's norm convention"),
        _f("phi", "Φ_h of the distribution-aware local bound (docs/math.md T4)"),
        _f("theta_tilde", "θ̃_h used in the local bound: max over the audited rows of theta_upper"),
        _f("mha_local_jacobian_upper_bound", "certified local Jacobian bound of attention with θ̃ (T4/T5)"),
        _f("mha_lipschitz_upper_bound", "certified length-independent Lipschitz bound with θ̃ = 1 (T5)"),
        _f("mha_jacobian_estimate", "empirical Jacobian norm (autograd, maximised over probes): a lower estimate"),
        _f("tightness_ratio", "mha_local_jacobian_upper_bound / mha_jacobian_estimate (≥ 1; 1 = tight)"),
        _f("ffn_lipschitz_upper_bound", "‖W_2‖_2 Lip(act) ‖W_1‖_2 (docs/math.md §2.7)"),
        _f("block_lipschitz_upper_bound", "certified Lipschitz bound of the whole residual block (T7)"),
        _f("block_jacobian_estimate", "empirical Jacobian norm of the residual block"),
        _f("ln_condition_fraction", "fraction of audited tokens satisfying the LayerNorm contraction condition (T6)"),
        _f("ln_contraction_ratio_median", "median over tokens of ‖γ‖_∞ / σ(x) at the norm input (T6)"),
        _f("residual_jacobian_upper_bound", "certified bound of the residual-stream Jacobian through the layer (T8)"),
        _f("residual_jacobian_estimate", "empirical residual-stream Jacobian norm through the layer (T8)"),
        _f("mha_local_paper_form_upper_bound", "‖W_O‖ Σ_h (‖W_V^h‖ + θ̃_h Φ_h/τ) at the actual input (T5 form)"),
        _f("mha_length_dependent_upper_bound", "the local chain without θ: θ replaced by n_keys/2 (baseline)"),
        _f("pre_ln_residual_jacobian_estimate", "estimate of ‖∂X_{k+1}/∂X_k‖ for the pre-LN arrangement (T8)"),
        _f("post_ln_residual_jacobian_estimate", "estimate of ‖∂X_{k+1}/∂X_k‖ for the post-LN arrangement (T8)"),
        _f("branch_jacobian_estimate", "estimate of the pre-LN branch norm ‖∂X_{k+1}/∂X_k − I‖ (T8)"),
        _f("ln_only_product_upper_bound", "Π over layers 0..ℓ of max_t ‖γ‖_∞/σ(y_t): bound of the LN-only term (T6)"),
        _f("expansion_remainder_upper_bound", "Π(1 + ‖J_k‖) − 1 − Σ‖J_k‖ over layers 0..ℓ, pre-LN (T8)"),
    ),
    key=("run_id", "step", "seed", "layer", "head"),
)

TRAINING = TableSchema(
    name="training",
    doc="One record per logged optimizer step of a training run; per-group gradient norms are in grad_norms.",
    columns=(
        _RUN_ID,
        _SEED,
        _STEP,
        _c("loss", _F64, "training loss (mean cross-entropy, nats per token) of the step"),
        _c("eval_loss", _F64, "loss on the held-out evaluation batch, where evaluated", nullable=True),
        _c("lr", _F64, "learning rate used for the step"),
        _c("grad_norm_global", _F64, "ℓ2 norm of the whole gradient before clipping"),
        _c("tokens_seen", _I64, "training tokens consumed up to and including the step"),
        _c("wall_time_s", _F64, "seconds since the start of training"),
    ),
    key=("run_id", "seed", "step"),
)

GRAD_NORMS = TableSchema(
    name="grad_norms",
    doc=(
        "Per-group gradient norms in long format (one record per run, step, layer and parameter group), "
        "so that any number of layers and groups fits one schema (docs/math.md §9.5)."
    ),
    columns=(
        _RUN_ID,
        _SEED,
        _STEP,
        _LAYER,
        _c("group", _STR, "parameter group: 'attn_qkv', 'attn_out', 'mlp_in', 'mlp_out', 'ln', 'embedding', ..."),
        _c("grad_norm", _F64, "ℓ2 norm of the group's gradient before clipping"),
    ),
    key=("run_id", "seed", "step", "layer", "group"),
)

INFLUENCE = TableSchema(
    name="influence",
    doc="Measured influence of a nonfinal token on the last position versus length n, beside C/n (docs/math.md §10).",
    columns=(
        _RUN_ID,
        _MODEL,
        _c("n", _I64, "sequence length"),
        _c("position_kind", _STR, "how the changed position i < n was chosen: 'first', 'middle' or 'random'"),
        _c("influence_max", _F64, "max over samples of ‖y_n − y'_n‖_2 at the last layer"),
        _c("influence_median", _F64, "median over samples of ‖y_n − y'_n‖_2"),
        _f("influence_upper_bound", "certified C / n (null where the theorem's assumptions fail)"),
        _c("tv_max", _F64, "max over samples of the total variation between next-token distributions"),
        _c("tv_median", _F64, "median of that total variation"),
        _c("n_samples", _I64, "number of sampled (input, position, replacement) triples"),
    ),
    key=("run_id", "model", "n", "position_kind"),
)

BASELINES = TableSchema(
    name="baselines",
    doc=(
        "What a study's eval loss is judged against, and the size of each trained model: count-based n-gram "
        "baselines scored on the same evaluation batch (name 'unigram' / 'bigram', run_id = study name) and one "
        "record per placement run_id with name 'model' and its parameter count."
    ),
    columns=(
        _RUN_ID,
        _c("name", _STR, "'unigram', 'bigram' or 'model'"),
        _f("eval_loss", "baseline cross-entropy on the evaluation batch in nats per token (null for 'model')"),
        _c("n_parameters", _I64, "parameter count of the run's model (null for baselines)", nullable=True),
    ),
    key=("run_id", "name"),
)

TABLES: dict[str, TableSchema] = {
    t.name: t for t in (ROWS, SUMMARY, BOUNDS, TRAINING, GRAD_NORMS, INFLUENCE, BASELINES)
}


def get_schema(name_or_schema: str | TableSchema) -> TableSchema:
    """The TableSchema called ``name`` (or the schema itself)."""
    if isinstance(name_or_schema, TableSchema):
        return name_or_schema
    try:
        return TABLES[name_or_schema]
    except KeyError:
        raise ConfigError(f"unknown results table {name_or_schema!r}; known tables: {', '.join(TABLES)}") from None
