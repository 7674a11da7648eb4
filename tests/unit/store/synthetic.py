"""A small synthetic run directory (test data, fixed seeds) with every results table.

Rows are softmax rows over at most 12 keys whose θ is computed exactly by enumerating all subsets, so the
theta columns are true values (theta_lower = theta_upper = θ), not produced by the code under test.
Attention sharpens with the step, and heads 0 put extra mass on key 0 (a sink), so that dominant rows exist.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from attnsens.store import Manifest, summarize_rows

STEPS = (0, 10, 100)
SEEDS = (0, 1)
N_LAYERS, N_HEADS, N_BATCH = 3, 5, 2
QUERIES = tuple(range(2, 12))
LENGTHS = (16, 32, 64, 128, 256, 512)


def exact_theta(p: np.ndarray) -> np.ndarray:
    """θ = s − 4 min_S (p(S) − s/2)² of each row of ``p`` [rows, n] by enumerating all 2^n subsets."""
    n = p.shape[-1]
    masks = np.array(list(itertools.product((0.0, 1.0), repeat=n)))
    subset_sums = p @ masks.T
    s = p.sum(axis=-1, keepdims=True)
    return (s - 4.0 * np.min((subset_sums - s / 2.0) ** 2, axis=-1, keepdims=True))[:, 0]


def rows_frame(model: str = "tiny-gpt", run_id: str = "run-a") -> pd.DataFrame:
    rng = np.random.default_rng(7)
    records = []
    for step, seed, layer, head, batch, query in itertools.product(
        STEPS, SEEDS, range(N_LAYERS), range(N_HEADS), range(N_BATCH), QUERIES
    ):
        n_keys = query + 1
        sharpness = 0.5 + 0.6 * np.log1p(step) * (1 + layer) / N_LAYERS
        logits = rng.standard_normal(n_keys) * sharpness
        if head == 0:
            logits[0] += 1.0 + np.log1p(step)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        records.append((step, seed, layer, head, batch, query, n_keys, p))
    theta = np.concatenate(
        [
            exact_theta(np.stack([r[7] for r in group]))
            for _, group in itertools.groupby(sorted(records, key=lambda r: r[6]), key=lambda r: r[6])
        ]
    )
    records.sort(key=lambda r: r[6])
    p_rows = [r[7] for r in records]
    entropy = np.array([-(p * np.log(p)).sum() for p in p_rows])
    n_keys = np.array([r[6] for r in records])
    p_max = np.array([p.max() for p in p_rows])
    row_sum = np.array([p.sum() for p in p_rows])
    return pd.DataFrame(
        {
            "run_id": run_id,
            "model": model,
            "step": [r[0] for r in records],
            "seed": [r[1] for r in records],
            "layer": [r[2] for r in records],
            "head": [r[3] for r in records],
            "batch": [r[4] for r in records],
            "query": [r[5] for r in records],
            "n_keys": n_keys,
            "row_sum": row_sum,
            "p_max": p_max,
            "argmax": [int(p.argmax()) for p in p_rows],
            "entropy": entropy,
            "normalized_entropy": entropy / np.log(n_keys),
            "n_eff": [1.0 / (p**2).sum() for p in p_rows],
            "theta_lower": theta,
            "theta_upper": theta,
            "theta_exact": True,
            "theta_method": np.int8(1),
            "dominant": p_max >= row_sum / 2,
        }
    )


def training_frames(run_id: str = "run-a") -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(11)
    steps = np.arange(0, 101, 5)
    training, grads = [], []
    for seed in SEEDS:
        loss = 8.0 * np.exp(-steps / 60) + 2.0 + 0.05 * rng.standard_normal(len(steps))
        training.append(
            pd.DataFrame(
                {
                    "run_id": run_id,
                    "seed": seed,
                    "step": steps,
                    "loss": loss,
                    "lr": 1e-3 * np.minimum(1.0, (steps + 1) / 20),
                    "grad_norm_global": 3.0 * np.exp(-steps / 40) + 0.5 + 0.1 * rng.random(len(steps)),
                    "tokens_seen": (steps + 1) * 4096,
                    "wall_time_s": steps * 0.5,
                }
            )
        )
        for layer, group in itertools.product(range(N_LAYERS), ("attn_qkv", "mlp_in")):
            grads.append(
                pd.DataFrame(
                    {
                        "run_id": run_id,
                        "seed": seed,
                        "step": steps,
                        "layer": layer,
                        "group": group,
                        "grad_norm": rng.random(len(steps)),
                    }
                )
            )
    return pd.concat(training, ignore_index=True), pd.concat(grads, ignore_index=True)


def bounds_frame(model: str = "tiny-gpt", run_id: str = "run-a") -> pd.DataFrame:
    rng = np.random.default_rng(13)
    records = []
    for step, seed, layer in itertools.product(STEPS, SEEDS, range(N_LAYERS)):
        for head in (-1, *range(N_HEADS)):
            w = 1.0 + 0.1 * rng.random(4) * (1 + np.log1p(step))
            estimate = 0.3 + 0.2 * rng.random()
            local = estimate * (2.0 + 3.0 * rng.random())
            records.append(
                {
                    "run_id": run_id,
                    "model": model,
                    "step": step,
                    "seed": seed,
                    "layer": layer,
                    "head": head,
                    "norm": "block_rms",
                    "norm_placement": "pre_ln",
                    "w_q_spectral_norm": w[0],
                    "w_k_spectral_norm": w[1],
                    "w_v_spectral_norm": w[2],
                    "w_o_spectral_norm": w[3],
                    "quartic_norm_product": float(np.prod(w)),
                    "theta_tilde": 0.9 + 0.1 * rng.random(),
                    "mha_local_jacobian_upper_bound": local,
                    "mha_lipschitz_upper_bound": local * 1.3,
                    "mha_jacobian_estimate": estimate,
                    "tightness_ratio": local / estimate,
                    "ln_condition_fraction": float(rng.random()) if head == -1 else None,
                    "ln_contraction_ratio_median": 0.5 + rng.random() if head == -1 else None,
                }
            )
    return pd.DataFrame(records)


def influence_frame(model: str = "builtin:lnfree", run_id: str = "run-a") -> pd.DataFrame:
    rng = np.random.default_rng(17)
    records = []
    for kind, n in itertools.product(("first", "middle"), LENGTHS):
        influence = 0.7 / n * (1 + 0.05 * rng.random())
        records.append(
            {
                "run_id": run_id,
                "model": model,
                "n": n,
                "position_kind": kind,
                "influence_max": influence,
                "influence_median": influence * 0.6,
                "influence_upper_bound": 7e8 / n,
                "tv_max": influence * 0.3,
                "tv_median": influence * 0.2,
                "n_samples": 30,
            }
        )
    return pd.DataFrame(records)


def write_synthetic_run(run_dir: Path, *, model: str = "tiny-gpt") -> Path:
    """Write every table of a small run under ``run_dir`` (one unit file per seed and step) with a manifest."""
    manifest = Manifest.open(run_dir, config={"model": model, "config": "tiny", "seeds": list(SEEDS)})
    rows = rows_frame(model=model)
    for (seed, step), part in rows.groupby(["seed", "step"]):
        manifest.write_unit(f"rows/seed={seed}/step={step:06d}.parquet", part, schema="rows")
        manifest.write_unit(f"summary/seed={seed}/step={step:06d}.parquet", summarize_rows(part), schema="summary")
    training, grads = training_frames()
    manifest.write_unit("training/all.parquet", training, schema="training")
    manifest.write_unit("grad_norms/all.parquet", grads, schema="grad_norms")
    manifest.write_unit("bounds/all.parquet", bounds_frame(model=model), schema="bounds")
    manifest.write_unit("influence/all.parquet", influence_frame(), schema="influence")
    return run_dir
