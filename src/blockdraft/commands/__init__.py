"""The verbs of `blockdraft`, one module each: `add_arguments(parser)` and `run(args) -> int`.

A verb module imports only argparse and light helpers at module level and loads torch, transformers
and the library code inside `run`, so `blockdraft --help` and `blockdraft doctor` start fast.
"""

from __future__ import annotations

# verb -> (module, help line); `regenerate` keeps its engine beside its entry point
VERBS: dict[str, tuple[str, str]] = {
    "demo": ("blockdraft.commands.demo", "train, export and evaluate a drafter for the bundled demo target"),
    "train": ("blockdraft.commands.train", "train a drafter from a YAML config"),
    "eval": ("blockdraft.commands.eval", "measure acceptance length with real speculative decoding"),
    "doctor": ("blockdraft.commands.doctor", "diagnose a training run from its log"),
    "export": ("blockdraft.commands.export", "write a checkpoint's drafter in serving format"),
    "data": ("blockdraft.commands.data", "inspect a dataset: counts, skips, lengths, batch plan"),
    "regenerate": ("blockdraft.data.regenerate", "let the target rewrite assistant turns (on-policy data)"),
    "bench": ("blockdraft.commands.bench", "throughput, MFU and memory on a target of a named shape"),
    "ckpt-scan": ("blockdraft.commands.ckpt_scan", "NaN/Inf and statistics of every tensor in a checkpoint"),
}
