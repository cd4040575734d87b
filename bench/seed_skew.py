"""The seed incident's length mix, as data files: its bucket boundaries (0/770/1216/1728/2432/3296/8192,
or those divided by --scale for the demo target's 512 tokens) with one bucket holding about half of the
micro-batches. Texts are windows of the bundled demo corpus, cut to the drawn token counts.

  python bench/seed_skew.py corpus OUT.jsonl --samples 20000              # for `blockdraft data`
  python bench/seed_skew.py corpus OUT.jsonl --samples 3000 --scale 16    # for CPU training runs
  python bench/seed_skew.py target DIR   # Qwen3-8B's config.json + the demo tokenizer (data only)
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from importlib import resources
from pathlib import Path

import numpy as np

BOUNDARIES = [0, 770, 1216, 1728, 2432, 3296, 8192]
SHARES = [0.25, 0.55, 0.10, 0.05, 0.03, 0.02]  # of samples: bucket 770-1216 gets about half the batches
DEMO = resources.files("blockdraft") / "assets"


def lengths(samples: int, scale: int, rng: np.random.Generator) -> np.ndarray:
    edges = [b // scale for b in BOUNDARIES]
    parts = [rng.integers(max(lo, 40 // scale + 8), hi, round(samples * s))
             for lo, hi, s in zip(edges[:-1], edges[1:], SHARES, strict=True)]
    return rng.permutation(np.concatenate(parts))


def write_corpus(out: Path, samples: int, scale: int, seed: int) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO / "demo-target"))
    with gzip.open(str(DEMO / "demo-corpus.jsonl.gz"), "rt") as fh:
        text = "\n".join(json.loads(line)["text"] for line in fh)
    stream = np.asarray(tok(text)["input_ids"])
    rng = np.random.default_rng(seed)
    with out.open("w") as fh:
        for n in lengths(samples, scale, rng).tolist():
            start = int(rng.integers(0, len(stream) - n))
            fh.write(json.dumps({"text": tok.decode(stream[start : start + n].tolist())}) + "\n")


def write_target(out: Path) -> None:
    from blockdraft.bench.shapes import SHAPES

    cls, shape = SHAPES["qwen3-8b"]
    out.mkdir(parents=True, exist_ok=True)
    cls(**shape, architectures=["Qwen3ForCausalLM"]).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(str(DEMO / "demo-target" / name), out / name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("out", type=Path)
    c.add_argument("--samples", type=int, default=20_000)
    c.add_argument("--scale", type=int, default=1, help="divide the boundaries (and lengths) by this")
    c.add_argument("--seed", type=int, default=7)
    t = sub.add_parser("target")
    t.add_argument("out", type=Path)
    args = p.parse_args()
    if args.what == "corpus":
        write_corpus(args.out, args.samples, args.scale, args.seed)
    else:
        write_target(args.out)


if __name__ == "__main__":
    main()
