"""The cost model (data/cost.py) against measured update times: a training log's updates, rebuilt.

The batch order is a pure function of (lengths, costs, config, seed, epoch, world_size x grad_accum),
so the micro-batches of every logged update can be rebuilt on a CPU from the log's run_start record,
the training data and the target's tokenizer and config.json: the data is tokenised as the trainer
did (prepare_dataset), the per-sample costs and the BatchSampler are built as in train/loop.py. Each
`step` record is placed in the plan by its own (epoch, epoch_progress) and checked against the
rebuilt update (samples, tokens, seq_len_max, buckets must be equal); then the predicted cost of the
update (FLOPs: the slowest rank's summed micro-batch cost) is compared with the logged step_time,
next to the old scheme's proxy (padded tokens, samples x seq_len_max).

Also: each update's passes (train/blocks.py: split_rows over `max_blocks_per_pass`) and the target's
input shape of each pass (rows, width); the first run of a shape is slower (warm-up), so the figures
are given over all compared updates and over the steady state (updates whose shapes all ran before).

Left out of the comparison: update 1 (compilation), updates with a `checkpoint` or `eval` record and
the update after each (the save's background write overlaps it), skipped (guarded) updates, and
updates over --compile-factor x the median step_time (the log has no recompile field: those are
taken as recompiles).

  PYTHONPATH=src python bench/cost_vs_time.py LOG --target DIR --data DIR [--cache-dir DIR]
      [--plot scatter.png] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

MATCH_FIELDS = ("samples", "tokens", "seq_len_max", "buckets")


# ---- statistics (tested in tests/bench/test_cost_vs_time.py) --------------------------------------
def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank (as Spearman's coefficient needs)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x), dtype=np.float64)
    r[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=r)
    counts = np.bincount(inverse)
    return (sums / counts)[inverse]


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(ranks(x), ranks(y))


def linear_fit(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Least squares y = a + b x: the coefficients, R^2 and the median |y - fit| / y."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(x, y, 1)
    fit = a + b * x
    ss_res, ss_tot = float(((y - fit) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    return {"a": float(a), "b": float(b), "r2": 1.0 - ss_res / ss_tot if ss_tot else float("nan"),
            "median_abs_rel_err": float(np.median(np.abs(y - fit) / np.abs(y)))}


def multi_fit(columns: dict[str, np.ndarray], y: np.ndarray) -> dict[str, Any]:
    """Least squares y = intercept + sum_k coef_k column_k: coefficients and R^2."""
    y = np.asarray(y, float)
    names = list(columns)
    cols = [np.asarray(columns[n], float) for n in names]
    scale = np.asarray([1.0, *[float(np.abs(c).max()) or 1.0 for c in cols]])  # well-conditioned columns
    design = np.column_stack([np.ones(len(y)), *cols])
    coef, *_ = np.linalg.lstsq(design / scale, y, rcond=None)
    coef = coef / scale
    fit = design @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"intercept": float(coef[0]), "coef": {n: float(c) for n, c in zip(names, coef[1:], strict=True)},
            "r2": 1.0 - float(((y - fit) ** 2).sum()) / ss_tot if ss_tot else float("nan"),
            "median_abs_rel_err": float(np.median(np.abs(y - fit) / np.abs(y)))}


def binned_spread(x: np.ndarray, y: np.ndarray, bins: int) -> list[dict[str, float]]:
    """y within `bins` quantile bins of x (equal counts): how much y varies at about the same x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    order = np.argsort(x, kind="stable")
    out = []
    for part in np.array_split(order, bins):
        if len(part) == 0:
            continue
        ys = y[part]
        med = float(np.median(ys))
        p10, p90 = (float(v) for v in np.percentile(ys, [10, 90]))
        out.append({"n": len(part), "x_lo": float(x[part].min()), "x_hi": float(x[part].max()),
                    "y_median": med, "y_p10": p10, "y_p90": p90, "y_cv": float(ys.std() / ys.mean()),
                    "p90_over_p10": p90 / p10})
    return out


def group_wait(values: np.ndarray, group: int) -> float:
    """Consecutive groups of `group` values run side by side (ranks): the mean share of a group's
    time that a member waits for the slowest, 1 - mean / max (a trailing partial group is dropped)."""
    v = np.asarray(values, float)
    n = len(v) // group * group
    if n == 0:
        return float("nan")
    g = v[:n].reshape(-1, group)
    return float(np.mean(1 - g.mean(axis=1) / g.max(axis=1)))


def predictor_summary(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    return {"pearson": pearson(x, y), "spearman": spearman(x, y), "fit": linear_fit(x, y)}


def step_position(rec: dict[str, Any], batches_per_epoch: int, grad_accum: int) -> tuple[int, int]:
    """(epoch, update within the epoch) of a `step` record, from its own epoch and epoch_progress:
    epoch_progress is (index of rank 0's last micro-batch + 1) / batches_per_epoch (data/prefetch.py)."""
    last = round(rec["epoch_progress"] * batches_per_epoch) - 1
    return int(rec["epoch"]), last // grad_accum


# ---- the log ---------------------------------------------------------------------------------------
def read_log(path: str | Path) -> dict[str, Any]:
    out: dict[str, Any] = {"run_start": None, "data": None, "steps": [], "other": []}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        kind = rec.get("kind")
        if kind in ("run_start", "data") and out[kind] is None:
            out[kind] = rec
        elif kind == "step":
            out["steps"].append(rec)
        else:
            out["other"].append(rec)
    if out["run_start"] is None:
        raise SystemExit(f"{path}: no run_start record")
    return out


def exclusions(steps: list[dict[str, Any]], other: list[dict[str, Any]], compile_factor: float) -> dict[int, str]:
    """Record index -> why it is left out (the first reason found)."""
    median = statistics.median(r["step_time"] for r in steps)
    marks: dict[int, str] = {}
    at_step: dict[int, list[int]] = {}
    for i, r in enumerate(steps):
        at_step.setdefault(r["step"], []).append(i)
    for rec in other:
        if rec.get("kind") in ("checkpoint", "eval"):
            for s, why in ((rec["step"], rec["kind"]), (rec["step"] + 1, f"after {rec['kind']}")):
                for i in at_step.get(s, []):
                    marks.setdefault(i, why)
        if rec.get("kind") in ("rollback", "resume"):
            for i in at_step.get(rec["step"] + 1, []):
                marks.setdefault(i, rec["kind"])
    for i, r in enumerate(steps):
        if i == 0:
            marks[i] = "update 1 (compilation)"
        elif r.get("skipped"):
            marks.setdefault(i, "skipped by the guard")
        elif r["step_time"] > compile_factor * median:
            marks.setdefault(i, f"step_time > {compile_factor:g} x median (recompile)")
    return marks


# ---- the rebuild -----------------------------------------------------------------------------------
def run_config(run_start: dict[str, Any], target: str, data: str, cache_dir: str | None):
    from blockdraft.config import build_config

    raw = copy.deepcopy(run_start["config"])
    raw["target"]["path"] = target
    raw["data"]["train_files"] = [data]
    raw["data"]["cache_dir"] = cache_dir
    raw["eval"]["prompts"] = []
    return build_config(raw)


def rebuild(cfg, run_start: dict[str, Any], target: str):
    """(dataset, sampler, costs, blocks per sample, layer ids) exactly as train/loop.py builds them
    (rank 0; every rank's micro-batches are in the sampler's global plan)."""
    from transformers import AutoConfig

    from blockdraft.config import default_layer_ids
    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.cache import prepare_dataset
    from blockdraft.data.cost import anchor_candidates, dataset_costs
    from blockdraft.model.target import text_config
    from blockdraft.model.tokenizer import load_tokenizer

    dataset, report = prepare_dataset(cfg.data, load_tokenizer(target), progress=False)
    hf = AutoConfig.from_pretrained(target)
    text = text_config(hf)
    layer_ids = cfg.drafter.target_layer_ids or default_layer_ids(text.num_hidden_layers, cfg.drafter.num_taps)
    costs = dataset_costs(dataset, hf, cfg, layer_ids)
    sampler = BatchSampler(dataset.lengths, cfg.data, seed=cfg.train.seed, rank=0,
                           world_size=int(run_start.get("world_size", 1)), grad_accum=cfg.train.grad_accum,
                           costs=costs)
    candidates, _ = anchor_candidates(dataset, cfg.drafter.block_size)
    blocks = np.minimum(candidates, cfg.train.num_anchors)
    return dataset, report, sampler, costs, blocks, layer_ids


def update_rows(sampler, costs, blocks: np.ndarray, max_blocks: int, positions: list[tuple[int, int]]):
    """Per (epoch, update): what the rebuilt update holds and what the cost model says of it."""
    from blockdraft.data.batching import batch_cost
    from blockdraft.train.blocks import split_rows

    g, a, w = sampler.update_size, sampler.grad_accum, sampler.world_size
    plans: dict[int, list] = {}
    rows = []
    for epoch, update in positions:
        if epoch not in plans:
            plans = {epoch: sampler.global_plan(epoch)}
        slots = plans[epoch][update * g : (update + 1) * g]
        lengths = [sampler.lengths[ids] for _, ids in slots]
        per_mb = np.asarray([batch_cost(ids, costs) for _, ids in slots])
        target_part = np.asarray([len(ids) * costs.row[ids].max() for _, ids in slots])
        groups = [split_rows(blocks[ids].tolist(), max_blocks) for _, ids in slots]
        passes = [len(gr) for gr in groups]
        # the target's input shape of each pass: (rows, width), rows in the micro-batch's order (collate)
        shapes = [(len(rows_), int(sampler.lengths[ids[rows_]].max())) for (_, ids), gr in zip(slots, groups,
                  strict=True) for rows_ in gr]
        rank = lambda v: np.asarray(v, float).reshape(w, a).sum(axis=1)  # noqa: E731
        slowest = int(np.argmax(rank(per_mb)))
        rows.append({
            "samples": sum(len(ids) for _, ids in slots),
            "tokens": int(sum(ln.sum() for ln in lengths)),
            "seq_len_max": int(max(ln.max() for ln in lengths)),
            "buckets": [int(b) for b, _ in slots],
            "padded": int(sum(len(ln) * ln.max() for ln in lengths)),
            "cost": float(rank(per_mb)[slowest]),
            "target_cost": float(rank(target_part)[slowest]),
            "drafter_cost": float(rank(per_mb - target_part)[slowest]),
            "passes": int(rank(passes)[slowest]),
            "blocks": int(sum(int(blocks[ids].sum()) for _, ids in slots)),
            "pass_shapes": shapes,
        })
    return rows


# ---- the report ------------------------------------------------------------------------------------
def new_shape_counts(shapes_per_update: list[list[tuple[int, int]]]) -> list[int]:
    """Per update, in order: how many of its passes ran a target input shape (rows, width) that no
    earlier update ran."""
    seen: set[tuple[int, int]] = set()
    out = []
    for shapes in shapes_per_update:
        out.append(sum(1 for sh in set(shapes) if sh not in seen))
        seen.update(shapes)
    return out


def compare(steps, rows, sel: list[int], sampler) -> dict[str, Any]:
    """Predicted cost and padded tokens against step_time over the updates `sel`."""
    t = np.asarray([steps[i]["step_time"] for i in sel])
    compute = t - np.asarray([steps[i].get("data_wait") or 0.0 for i in sel])
    cost = np.asarray([rows[i]["cost"] for i in sel])
    padded = np.asarray([steps[i]["samples"] * steps[i]["seq_len_max"] for i in sel], float)
    passes = np.asarray([rows[i]["passes"] for i in sel], float)
    fit = linear_fit(cost, t)
    budget = sampler.cost_budget
    top = np.asarray([max(rows[i]["buckets"]) for i in sel])
    by_bucket = []
    for b in sorted(set(top.tolist())):
        m = top == b
        lo, hi = sampler.edges[b]
        by_bucket.append({
            "bucket": b, "lengths": f"{lo}-{hi if hi is not None else ''}", "updates": int(m.sum()),
            "mean_cost_over_budget": float(cost[m].mean() / budget), "mean_padded_tokens": float(padded[m].mean()),
            "mean_samples": float(np.mean([steps[i]["samples"] for i, k in zip(sel, m, strict=True) if k])),
            "mean_passes": float(passes[m].mean()),
            "mean_time_s": float(t[m].mean()), "median_time_s": float(np.median(t[m])),
            "mean_fit_s": float((fit["a"] + fit["b"] * cost[m]).mean()),
            "time_over_mean": float(t[m].mean() / t.mean()),
        })
    by_passes = {}
    for k in sorted(set(passes.tolist())):
        m = passes == k
        entry = {"updates": int(m.sum()), "mean_time_s": float(t[m].mean()),
                 "mean_cost_over_budget": float(cost[m].mean() / budget)}
        if m.sum() >= 10:
            entry["cost_within"] = {"pearson": pearson(cost[m], t[m]), "r2": linear_fit(cost[m], t[m])["r2"]}
        by_passes[str(int(k))] = entry
    return {
        "updates": len(sel),
        "by_passes": by_passes,
        "step_time_s": {"median": float(np.median(t)), "mean": float(t.mean()), "p10": float(np.percentile(t, 10)),
                        "p90": float(np.percentile(t, 90)), "cv": float(t.std() / t.mean())},
        "predicted_cost_cv": float(cost.std() / cost.mean()),
        "cost": {**predictor_summary(cost, t), "fit_per_budget_s": fit["b"] * budget,
                 "mean_flops_per_s": float(cost.sum() / t.sum())},
        "padded_tokens": predictor_summary(padded, t),
        "passes": predictor_summary(passes, t),
        "cost_vs_compute_time": predictor_summary(cost, compute),
        "components_fit": multi_fit({"target_flops": [rows[i]["target_cost"] for i in sel],
                                     "drafter_flops": [rows[i]["drafter_cost"] for i in sel], "passes": passes}, t),
        "by_bucket": by_bucket,
        "spread_at_similar_cost": binned_spread(cost / budget, t, 10),
        "wait_if_side_by_side": {f"{w}_ranks": {"measured": group_wait(t, w), "predicted_cost": group_wait(cost, w),
                                                "padded_tokens": group_wait(padded, w)} for w in (2, 8)},
        "_arrays": {"cost": cost / budget, "padded": padded, "time": t, "bucket": top},
    }


def analyse(log: dict[str, Any], rows: list[dict[str, Any]], sampler, compile_factor: float) -> dict[str, Any]:
    steps = log["steps"]
    matched = [all(r[f] == s[f] for f in MATCH_FIELDS) for r, s in zip(rows, steps, strict=True)]
    per_field = {f: sum(r[f] == s[f] for r, s in zip(rows, steps, strict=True)) for f in MATCH_FIELDS}
    marks = exclusions(steps, log["other"], compile_factor)
    for i, m in enumerate(matched):
        if not m:
            marks.setdefault(i, "not reconstructed")
    keep = [i for i in range(len(steps)) if i not in marks]
    reasons: dict[str, list[int]] = {}
    for i, why in sorted(marks.items()):
        reasons.setdefault(why, []).append(steps[i]["step"])
    new = new_shape_counts([r["pass_shapes"] for r in rows])
    steady = [i for i in keep if new[i] == 0]
    t = np.asarray([steps[i]["step_time"] for i in keep])
    by_new = {}
    for k in sorted({new[i] for i in keep}):
        ts = [steps[i]["step_time"] for i in keep if new[i] == k]
        by_new[str(k)] = {"updates": len(ts), "median_time_s": float(np.median(ts)), "mean_time_s": float(np.mean(ts))}
    anchors = np.asarray([steps[i]["anchors"] for i in keep], float)
    blocks = np.asarray([rows[i]["blocks"] for i in keep], float)
    return {
        "updates_logged": len(steps),
        "reconstruction": {"updates_matched": sum(matched), "match_rate": sum(matched) / len(steps),
                           "per_field": per_field,
                           "unmatched_steps": [s["step"] for s, m in zip(steps, matched, strict=True) if not m][:20],
                           "anchors_equal_rebuilt_blocks": sum(r["blocks"] == s["anchors"]
                                                               for r, s in zip(rows, steps, strict=True)),
                           "logged_anchors_over_rebuilt_blocks": float(np.mean(anchors / blocks))},
        "excluded": {"count": len(marks),
                     "reasons": {k: {"count": len(v), "steps": v[:20]} for k, v in reasons.items()}},
        "cost_unit": sampler.costs.kind, "cost_budget": sampler.cost_budget,
        "new_target_shapes": {
            "by_count": by_new,
            "fit_cost_plus_new_shapes": multi_fit({"cost": [rows[i]["cost"] for i in keep],
                                                   "new_shapes": [new[i] for i in keep]}, t),
        },
        "all": compare(steps, rows, keep, sampler),
        "steady": compare(steps, rows, steady, sampler),
    }


def comparison_table(res: dict[str, Any]) -> list[str]:
    lines = ["predictor        pearson  spearman   R^2   med|rel err|  fit"]
    for name, key in (("FLOPs (cost)", "cost"), ("padded tokens", "padded_tokens"), ("passes", "passes")):
        s, f = res[key], res[key]["fit"]
        lines.append(f"{name:15s} {s['pearson']:8.3f} {s['spearman']:9.3f} {f['r2']:6.3f} "
                     f"{f['median_abs_rel_err']:11.1%}   t = {f['a']:.4f} + {f['b']:.3g} x")
    for k, v in res["by_passes"].items():
        within = (f", FLOPs within: pearson {v['cost_within']['pearson']:.3f}, R^2 {v['cost_within']['r2']:.3f}"
                  if "cost_within" in v else "")
        lines.append(f"{k} passes: {v['updates']} updates, mean t {v['mean_time_s']:.3f} s, "
                     f"cost/budget {v['mean_cost_over_budget']:.3f}{within}")
    cf = res["components_fit"]
    lines.append("t = {:.4f} + {}  (R^2 {:.3f})".format(
        cf["intercept"], " + ".join(f"{v:.3g} {k}" for k, v in cf["coef"].items()), cf["r2"]))
    lines.append("bucket lengths   updates  cost/budget  padded  samples passes  mean t (s)  fit t (s)  t/mean")
    for b in res["by_bucket"]:
        lines.append(f"{b['bucket']:6d} {b['lengths']:9s} {b['updates']:7d} {b['mean_cost_over_budget']:12.3f} "
                     f"{b['mean_padded_tokens']:7.0f} {b['mean_samples']:7.1f} {b['mean_passes']:6.2f} "
                     f"{b['mean_time_s']:11.3f} {b['mean_fit_s']:10.3f} {b['time_over_mean']:7.2f}")
    lines.append("cost/budget bin   n   median t  p10    p90    CV     p90/p10")
    for b in res["spread_at_similar_cost"]:
        lines.append(f"{b['x_lo']:.3f}-{b['x_hi']:.3f} {b['n']:4d} {b['y_median']:8.3f} {b['y_p10']:6.3f} "
                     f"{b['y_p90']:6.3f} {b['y_cv']:6.3f} {b['p90_over_p10']:7.2f}")
    for k, v in res["wait_if_side_by_side"].items():
        lines.append(f"wait share, {k} side by side: measured {v['measured']:.1%}, predicted by cost "
                     f"{v['predicted_cost']:.1%}, by padded tokens {v['padded_tokens']:.1%}")
    return lines


def table(res: dict[str, Any]) -> str:
    rec = res["reconstruction"]
    lines = [f"reconstruction: {rec['updates_matched']}/{res['updates_logged']} updates match "
             f"({rec['match_rate']:.1%}) on {', '.join(MATCH_FIELDS)}"]
    ex = ", ".join(f"{k}: {v['count']}" for k, v in res["excluded"]["reasons"].items())
    lines.append(f"excluded {res['excluded']['count']} ({ex}); compared {res['all']['updates']}")
    lines.append("passes running a target input shape (rows, width) for the first time: "
                 + ", ".join(f"{k}: {v['updates']} updates, median {v['median_time_s']:.3f} s"
                             for k, v in res["new_target_shapes"]["by_count"].items()))
    nf = res["new_target_shapes"]["fit_cost_plus_new_shapes"]
    lines.append("t = {:.4f} + {}  (R^2 {:.3f})".format(
        nf["intercept"], " + ".join(f"{v:.3g} {k}" for k, v in nf["coef"].items()), nf["r2"]))
    for name in ("all", "steady"):
        title = {"all": "all compared updates", "steady": "steady state: updates whose passes' shapes all ran before"}
        lines.append(f"== {title[name]} ({res[name]['updates']})")
        lines += comparison_table(res[name])
    return "\n".join(lines)


def plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey=True)
    for r, name in enumerate(("all", "steady")):
        arr = res[name]["_arrays"]
        for ax, key, label in ((axes[r, 0], "cost", "predicted cost / cost budget (FLOPs)"),
                               (axes[r, 1], "padded", "padded tokens (samples x seq_len_max)")):
            sc = ax.scatter(arr[key], arr["time"], c=arr["bucket"], s=6, cmap="viridis")
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            r2 = res[name]["cost" if key == "cost" else "padded_tokens"]["fit"]["r2"]
            ax.set_title(f"{name}: {res[name]['updates']} updates, R^2 {r2:.2f}", fontsize=9)
        axes[r, 0].set_ylabel("measured step_time (s)")
    fig.subplots_adjust(hspace=0.35)
    fig.colorbar(sc, ax=axes, label="length bucket")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--target", required=True, help="the target folder (tokenizer and config.json)")
    p.add_argument("--data", required=True, help="the training data the run read")
    p.add_argument("--cache-dir", help="data cache (default: blockdraft's)")
    p.add_argument("--compile-factor", type=float, default=4.0)
    p.add_argument("--plot")
    p.add_argument("--json", help="write the JSON here (default: stdout, after the table on stderr)")
    args = p.parse_args()
    log = read_log(args.log)
    start = log["run_start"]
    cfg = run_config(start, args.target, args.data, args.cache_dir)
    dataset, report, sampler, costs, blocks, layer_ids = rebuild(cfg, start, args.target)
    checks = {"layer_ids_as_logged": layer_ids == start.get("target_layer_ids"),
              "batches_per_epoch_as_logged": sampler.batches_per_epoch == start.get("batches_per_epoch")}
    if log["data"] is not None:
        d, desc = log["data"], sampler.describe(epochs=1)
        checks.update({
            "samples_as_logged": len(dataset) == d.get("samples_used"),
            "tokens_as_logged": int(dataset.lengths.sum()) == d.get("tokens"),
            "cost_budget_rel_diff": abs(sampler.cost_budget - d["cost_budget"]) / d["cost_budget"],
            "bucket_batches_as_logged": [b["batches"] for b in desc["buckets"]] == [b["batches"] for b in d["buckets"]],
        })
    max_blocks = cfg.train.max_blocks_per_pass or (1536 if start.get("device") == "cuda" else cfg.train.num_anchors)
    positions = [step_position(r, sampler.batches_per_epoch, sampler.grad_accum) for r in log["steps"]]
    rows = update_rows(sampler, costs, blocks, max_blocks, positions)
    res = analyse(log, rows, sampler, args.compile_factor)
    res["checks"] = checks
    res["consecutive_positions"] = all(
        (e2, u2) == ((e1, u1 + 1) if u1 + 1 < sampler.updates_per_epoch else (e1 + 1, 0))
        for (e1, u1), (e2, u2) in zip(positions, positions[1:], strict=False))
    if args.plot:
        plot(res, args.plot)
    for name in ("all", "steady"):
        res[name].pop("_arrays")
    print(table(res), file=sys.stderr)
    print("checks: " + json.dumps(checks) + f", consecutive positions: {res['consecutive_positions']}", file=sys.stderr)
    text = json.dumps(res, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
