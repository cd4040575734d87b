"""Benchmark: tokenise ShareGPT-sized conversations through `prepare_dataset` (cold, then cached).

Nothing is downloaded. A byte-level BPE tokenizer (32k vocabulary, Qwen3-style chat template) is
trained on the Python standard library, and synthetic conversations are cut from its docstrings
(English prose) and, for a quarter of the assistant turns, its code, with ShareGPT-like shapes:
1-8 rounds (mean about 3), user turns of a few hundred characters, assistant turns of about 1,200
(about 5 kB of text and 1,300 tokens per conversation). It also times the bare tokenizer on the
same rendered text: the floor that no data pipeline can go below.

    PYTHONPATH=src .venv/bin/python bench/bench_tokenize.py --n 100000
"""

from __future__ import annotations

import argparse
import ast
import json
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from blockdraft.config import DataConfig
from blockdraft.corpus import read_source, stdlib_files
from blockdraft.data.batching import BatchSampler
from blockdraft.data.cache import CHUNK_LINES, prepare_dataset, worker_count

QWEN_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last_user and loop.last -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)


def source_text(limit_chars: int) -> tuple[str, str]:
    """(prose, code) from the standard library: its docstrings, and its source."""
    docs, code, size = [], [], 0
    for path in stdlib_files("train"):
        text = read_source(path)
        if not text:
            continue
        code.append(text)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    docs.append(doc)
                    size += len(doc)
        if size >= limit_chars:
            break
    return "\n\n".join(docs), "".join(code)


def build_tokenizer(text: str, folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((text[i : i + 100_000] for i in range(0, len(text), 100_000)), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_tokens(["<think>", "</think>"])
    fast.chat_template = QWEN_STYLE_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def write_conversations(prose: str, code: str, n: int, path: Path) -> float:
    """n conversations cut from the texts; returns the mean characters per conversation."""
    rng = np.random.default_rng(0)
    rounds = np.minimum(rng.geometric(0.4, n), 8)
    total_chars = 0
    with path.open("w", encoding="utf-8") as fh:
        for r in rounds.tolist():
            msgs = []
            for _ in range(r):
                for role, mean in (("user", 300), ("assistant", 1300)):
                    size = int(min(6 * mean, rng.lognormal(np.log(mean), 0.6)))
                    text = code if role == "assistant" and rng.random() < 0.25 else prose
                    start = int(rng.integers(0, len(text) - size))
                    msgs.append({"role": role, "content": text[start : start + size]})
                    total_chars += size
            fh.write(json.dumps({"messages": msgs}) + "\n")
    return total_chars / n


def bare_tokenizer_seconds(tokenizer, data: Path, sample: int) -> float:
    """CPU seconds of encoding the first `sample` conversations, rendered beforehand, in batches of the
    pipeline's chunk size (`encode_batch` costs less CPU than one `encode` call per text)."""
    with data.open(encoding="utf-8") as fh:
        chats = [json.loads(next(fh))["messages"] for _ in range(sample)]
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in chats]
    start = time.process_time()
    for i in range(0, len(texts), CHUNK_LINES):
        tokenizer.backend_tokenizer.encode_batch(texts[i : i + CHUNK_LINES], add_special_tokens=False)
    return time.process_time() - start


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the tokeniser processes): unlike wall
    time, barely moved by other jobs on a shared box, so before/after comparisons hold."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="conversations")
    parser.add_argument("--workdir", default="/tmp/blockdraft-bench-tokenize")
    parser.add_argument("--workers", type=int, default=0, help="tokeniser processes (0: one per core)")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    prose, code = source_text(6_000_000)
    tokenizer = build_tokenizer(prose + code[:6_000_000], work / "tokenizer")
    data = work / f"sharegpt_like_{args.n}.jsonl"
    mean_chars = write_conversations(prose, code, args.n, data)
    shutil.rmtree(work / "cache", ignore_errors=True)
    cfg = DataConfig(cache_dir=str(work / "cache"), max_len=8192, num_workers=args.workers)

    start, cpu_start = time.perf_counter(), cpu_seconds()
    dataset, report = prepare_dataset(cfg, tokenizer, [str(data)], progress=sys.stderr.isatty())
    cold, cold_cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    start = time.perf_counter()
    prepare_dataset(cfg, tokenizer, [str(data)])
    warm = time.perf_counter() - start
    start = time.perf_counter()
    described = BatchSampler(dataset.lengths, cfg, seed=0).describe()
    plan = time.perf_counter() - start
    floor = bare_tokenizer_seconds(tokenizer, data, sample=2000) * args.n / 2000 / worker_count(cfg)

    result = {
        "conversations": args.n,
        "file_mb": round(data.stat().st_size / 1e6, 1),
        "mean_chars": round(mean_chars),
        "samples_used": report.samples_used,
        "tokens": report.tokens,
        "mean_tokens": round(report.tokens / report.samples_used),
        "truncated": report.truncated,
        "workers": worker_count(cfg),
        "cold_s": round(cold, 1),
        "cold_cpu_s": round(cold_cpu, 1),
        "bare_tokenizer_floor_s": round(floor, 1),
        "samples_per_s": round(report.samples_used / cold),
        "tokens_per_s": round(report.tokens / cold),
        "cached_s": round(warm, 2),
        "plan_s": round(plan, 2),
        "batches": described["batches"],
        "pad_frac": described["pad_frac"],
        "max_same_bucket_run": described["max_same_bucket_run"],
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
