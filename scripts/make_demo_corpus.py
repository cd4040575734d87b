"""Regenerate the demo's training corpus with the demo target itself (on-policy data, as in the
DFlash recipe): prompts are the openings of stdlib chunks from the drafter's part of the files (the
target never trained on them), responses are the target's greedy continuations. Writes gzipped JSONL
of {"text": prompt + response}.

    python scripts/make_demo_corpus.py --target src/blockdraft/assets/demo-target \
        --out src/blockdraft/assets/demo-corpus.jsonl.gz [--samples 4096]

Held-out files are never used here: the demo measures tau on prompts from held-out files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blockdraft.corpus import chunk_lines, read_source, stdlib_files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--split", choices=["drafter", "train"], default="drafter",
                    help="stdlib files to take prompts from (train: all the target saw too)")
    ap.add_argument("--chunk-chars", type=int, default=600, help="one prompt per chunk of this many characters")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.target)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()

    chunks = [c for f in stdlib_files(args.split) for c in chunk_lines(read_source(f) or "", args.chunk_chars)]
    stride = max(1, len(chunks) // args.samples)
    prompts = chunks[::stride][: args.samples]
    t0, written = time.time(), 0
    with gzip.open(args.out, "wt", encoding="utf-8") as fh:
        for start in range(0, len(prompts), args.batch):
            enc = tok(prompts[start : start + args.batch], return_tensors="pt", padding=True, truncation=True,
                      max_length=args.prompt_tokens, add_special_tokens=False).to(device)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=args.new_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
            for row, mask in zip(out, enc["attention_mask"], strict=True):
                prompt_len = int(mask.sum())
                ids = row[len(mask) - prompt_len :].tolist()  # drop left padding
                if tok.eos_token_id in ids[prompt_len:]:
                    ids = ids[: ids.index(tok.eos_token_id, prompt_len) + 1]
                fh.write(json.dumps({"text": tok.decode(ids, skip_special_tokens=True)}) + "\n")
                written += 1
            print(f"{written}/{len(prompts)} samples, {time.time() - t0:.0f}s", flush=True)
    print(f"wrote {written} samples to {args.out} in {time.time() - t0:.0f}s on {device}")


if __name__ == "__main__":
    main()
