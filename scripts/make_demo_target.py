"""Train the bundled demo target: a small Qwen3 on the Python standard library's source.

    python scripts/make_demo_target.py --out src/blockdraft/assets/demo-target

The defaults are the bundled target's recipe (vocab 4096, hidden 128, 3 layers, 800 steps).

Steps: (1) a byte-level BPE tokenizer trained on the target's part of the stdlib (blockdraft.corpus),
reserving <|endoftext|> and the drafter's <|MASK|> token; (2) a Qwen3ForCausalLM from a config
(random init) trained on packed windows of the same files; (3) held-out loss on the held-out files;
(4) weights (bf16), tokenizer and a model card written to --out.
Runs on a GPU when there is one (bf16 autocast), else on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from blockdraft.corpus import read_source, stdlib_files

SPECIALS = ["<|endoftext|>", "<|MASK|>"]


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|MASK|>",
        model_max_length=2048,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """All texts back to back, each followed by <|endoftext|>, as one int32 array."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def model_config(vocab_size: int, args: argparse.Namespace) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        head_dim=64,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        architectures=["Qwen3ForCausalLM"],
    )


@torch.no_grad()
def heldout_loss(model: Qwen3ForCausalLM, stream: np.ndarray, seq_len: int, device: torch.device) -> float:
    model.eval()
    n = (len(stream) - 1) // seq_len
    windows = torch.from_numpy(stream[: n * seq_len + 1].astype(np.int64))
    total, count = 0.0, 0
    for start in range(0, n, 32):
        idx = torch.arange(start, min(n, start + 32))
        x = torch.stack([windows[i * seq_len : (i + 1) * seq_len] for i in idx]).to(device)
        y = torch.stack([windows[i * seq_len + 1 : (i + 1) * seq_len + 1] for i in idx]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits.float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / max(count, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=100, help="held-out loss on a slice, every N steps")
    ap.add_argument("--max-files", type=int, default=None, help="for a quick smoke run")
    ap.add_argument("--split", choices=["target", "train"], default="target",
                    help="stdlib files to train on: the target part (default) or target + drafter parts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_texts = [t for t in map(read_source, stdlib_files(args.split)[: args.max_files]) if t]
    held_texts = [t for t in map(read_source, stdlib_files("heldout")[: args.max_files]) if t]
    t0 = time.time()
    tokenizer = train_tokenizer(train_texts, args.vocab)
    train_stream = encode_stream(tokenizer, train_texts)
    held_stream = encode_stream(tokenizer, held_texts)
    print(f"tokenizer {len(tokenizer)} tokens in {time.time() - t0:.0f}s; "
          f"train {len(train_stream):,} tokens ({len(train_texts)} files), "
          f"held-out {len(held_stream):,} tokens ({len(held_texts)} files)", flush=True)

    model = Qwen3ForCausalLM(model_config(len(tokenizer), args)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    )
    rng = np.random.default_rng(args.seed)
    data = torch.from_numpy(train_stream.astype(np.int64))
    t0 = time.time()
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(train_stream) - args.seq_len - 1, size=args.batch)
        x = torch.stack([data[s : s + args.seq_len] for s in starts]).to(device, non_blocking=True)
        y = torch.stack([data[s + 1 : s + args.seq_len + 1] for s in starts]).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every == 0 or step == args.steps:
            held = heldout_loss(model, held_stream[: 64 * args.seq_len + 1], args.seq_len, device)
            print(f"step {step} loss {loss.item():.3f} held-out {held:.3f} {time.time() - t0:.0f}s", flush=True)

    held = heldout_loss(model, held_stream, args.seq_len, device)
    print(f"held-out loss {held:.3f} nats/token over {len(held_stream):,} tokens", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    card = {
        "params": n_params,
        "train_tokens_seen": args.steps * args.batch * args.seq_len,
        "train_split_tokens": int(len(train_stream)),
        "heldout_tokens": int(len(held_stream)),
        "heldout_loss": round(held, 4),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "train_seconds": round(time.time() - t0, 1),
    }
    (args.out / "training.json").write_text(json.dumps(card, indent=2) + "\n")
    print(json.dumps(card), flush=True)


if __name__ == "__main__":
    main()
