"""`blockdraft regenerate`: the target rewrites every assistant turn, given the conversation so far.

DFlash drafters learn the target's own continuations, so training data should come from the target
(on-policy). Turns are regenerated in order, so later turns see earlier regenerated ones; a chat that
ends with a user turn (prompt-only, or a `text` record) gets a new final answer. Each
`OUT/shard-NNNNN.jsonl` is renamed into place when complete, so a rerun skips finished shards;
`OUT/manifest.json` pins inputs and settings, so a rerun with others is refused rather than mixed in.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blockdraft.config import DATA_FORMATS
from blockdraft.data.reading import MANIFEST, BadRecord, Text, check_files, iter_records
from blockdraft.device import DEVICES
from blockdraft.errors import UserError, check_at_least

MANIFEST_SETTINGS = ("format", "max_new_tokens", "temperature", "top_p", "thinking", "shard_size", "prompt_tokens",
                     "seed")  # the flags a rerun must repeat, besides the inputs and the target
GROUP_BATCHES = 4  # conversations handed to the engine at once, in batches: progress comes per group
CUT_SHARE_NOTE = 0.2  # above this share of cut answers, the summary suggests a larger --max-new-tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, metavar="DIR", help="target model folder")
    parser.add_argument("--in", dest="inputs", required=True, nargs="+", metavar="FILE", help="input chats")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (shards + manifest)")
    parser.add_argument("--max-new-tokens", type=int, default=2048, metavar="N")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=False,
                        help="render prompts with thinking on (enable_thinking)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                        help="conversations decoded at once (a small target on a GPU wants 256 or more)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, metavar="N",
                        help="longer prompts keep their last N tokens; sizes the static cache")
    parser.add_argument("--cache", choices=["auto", "static", "dynamic"], default="auto",
                        help="hf engine KV cache; auto: static (compiled, CUDA graphs) on a GPU, dynamic on CPU")
    parser.add_argument("--chunk-tokens", type=int, default=64, metavar="N",
                        help="answer tokens per generate call; after each, finished rows make room (0: one call)")
    parser.add_argument("--shard-size", type=int, default=1000, metavar="N", help="conversations per shard")
    parser.add_argument("--format", choices=DATA_FORMATS, default="auto")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--seed", type=int, default=0)


def _turns_to_write(messages: list[dict[str, str]]) -> list[int]:
    """Indices the target writes: every assistant turn, plus a new one after a final user turn."""
    spots = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if messages and messages[-1]["role"] == "user":
        spots.append(len(messages))
    return spots


def regenerate_batch(
    engine: Any, tokenizer: Any, chats: list[list[dict[str, str]]], args: argparse.Namespace
) -> tuple[list[tuple[list[dict[str, str]], bool]], int]:
    """Rewrite the chats turn by turn: round k generates the k-th answer of every chat that has one.
    Returns (chat, finished) per chat and the number of answer tokens generated."""
    chats = [list(c) for c in chats]
    spots = [_turns_to_write(c) for c in chats]
    finished = [True] * len(chats)
    tokens = 0
    for k in range(max((len(s) for s in spots), default=0)):
        todo = [i for i, s in enumerate(spots) if k < len(s)]
        prompts = [
            tokenizer.apply_chat_template(
                chats[i][: spots[i][k]], tokenize=False, add_generation_prompt=True, enable_thinking=args.thinking
            )
            for i in todo
        ]
        outputs = engine.generate(prompts, args.max_new_tokens, args.temperature, args.top_p, args.prompt_tokens,
                                  args.batch_size)
        for i, (text, done, n_tokens) in zip(todo, outputs, strict=True):
            tokens += n_tokens
            turn = {"role": "assistant", "content": text}
            if spots[i][k] == len(chats[i]):
                chats[i].append(turn)
            else:
                chats[i][spots[i][k]] = turn
            finished[i] = finished[i] and done
    return list(zip(chats, finished, strict=True)), tokens


def _read_inputs(paths: list[Path], fmt: str, skipped: dict[str, int]) -> Iterator[tuple[str, list]]:
    for path in paths:
        for line, record in iter_records(path, fmt, require_assistant=False):
            if isinstance(record, BadRecord):
                skipped[record.reason] = skipped.get(record.reason, 0) + 1
            elif isinstance(record, Text):
                yield f"{path}:{line}", [{"role": "user", "content": record.text}]
            else:
                yield f"{path}:{line}", record.messages


def _shards(records: Iterator[tuple[str, list]], size: int) -> Iterator[list[tuple[str, list]]]:
    while shard := list(itertools.islice(records, size)):
        yield shard


def _check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        if old != manifest:
            diff = sorted(k for k in manifest if old.get(k) != manifest[k])
            raise UserError(
                f"{out} holds shards made from other inputs or settings ({', '.join(diff)} differ); "
                "use a new --out folder or the same settings"
            )
    else:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=1))


def _write_shard(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


class _Progress:
    """A rich bar in a terminal; elsewhere (nohup, slurm, a pipe) one plain line every `every_s` seconds."""

    def __init__(self, total: int, every_s: float = 30.0) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.total, self.every_s = total, every_s
        self.done = self.tokens = 0
        self.start = self.last_line = time.perf_counter()
        self.plain = not sys.stderr.isatty()
        self.bar = Progress(TextColumn("regenerating"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]:,.0f} answer tok/s"), TimeRemainingColumn(),
                            console=Console(stderr=True), disable=self.plain)
        self.task = self.bar.add_task("regenerating", total=total, rate=0.0)

    @property
    def rate(self) -> float:
        return self.tokens / max(1e-9, time.perf_counter() - self.start)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        return (f"regenerate: {self.done}/{self.total} conversations, {self.tokens:,} answer tokens in "
                f"{elapsed:.0f} s ({self.rate:,.0f} tok/s, {self.done / max(1e-9, elapsed):.1f} conversations/s)")

    def advance(self, conversations: int, tokens: int) -> None:
        self.done += conversations
        self.tokens += tokens
        self.bar.update(self.task, advance=conversations, rate=self.rate)
        if self.plain and time.perf_counter() - self.last_line >= self.every_s:
            self.last_line = time.perf_counter()
            print(self.line(), file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """SIGTERM (`timeout`, schedulers) interrupts as Ctrl-C does: report, then stop. The handler is put
    back on the way out, so a caller's process (and any worker it starts later) keeps its own."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _regenerate(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _regenerate(args: argparse.Namespace) -> int:
    from blockdraft.data.cache import file_digest
    from blockdraft.model.locate import locate_model
    from blockdraft.model.tokenizer import load_tokenizer

    check_at_least(args, 1, "batch_size", "prompt_tokens", "shard_size", "max_new_tokens")
    if args.chunk_tokens < 0:
        raise UserError("--chunk-tokens must be >= 0 (0: the whole answer in one call)")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UserError("--temperature must be >= 0 and --top-p in (0, 1]")
    paths = check_files(args.inputs)
    out = Path(args.out)
    args.target = str(locate_model(args.target))  # a folder, or a hub id from the local cache
    tokenizer = load_tokenizer(args.target)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {args.target} has no chat template; regeneration needs one")
    manifest = {
        "inputs": [{"path": str(p), "digest": file_digest(p)} for p in paths],
        "target": str(Path(args.target).resolve()),
        **{key: getattr(args, key) for key in MANIFEST_SETTINGS},
    }
    _check_manifest(out, manifest)

    total = sum(1 for _ in _read_inputs(paths, args.format, {}))  # a cheap first pass: exact totals
    if not total:
        raise UserError(f"no usable conversations in {', '.join(args.inputs)}")
    n_shards = -(-total // args.shard_size)
    todo = {k for k in range(n_shards) if not (out / f"shard-{k:05d}.jsonl").is_file()}
    remaining = sum(min(args.shard_size, total - k * args.shard_size) for k in todo)
    skipped: dict[str, int] = {}
    engine = None
    unfinished = 0
    shards_written = 0
    progress = _Progress(remaining)
    with progress.bar:  # the rich bar shows while shards are written, and stops on the way out
        try:
            for k, shard in enumerate(_shards(_read_inputs(paths, args.format, skipped), args.shard_size)):
                if k not in todo:
                    continue
                if engine is None:
                    from blockdraft.data.engines import HFEngine, VLLMEngine

                    if args.engine == "vllm":
                        engine = VLLMEngine(args.target, tokenizer, args.seed)
                    else:
                        engine = HFEngine(args.target, tokenizer, args.device, args.cache, args.chunk_tokens)
                engine.reseed(args.seed + k)  # a rerun of this shard samples the same way
                order = sorted(range(len(shard)), key=lambda i: sum(len(m["content"]) for m in shard[i][1]))
                rows: dict[int, dict[str, Any]] = {}
                group = GROUP_BATCHES * args.batch_size  # the engine refills its rows within a group
                for b in range(0, len(order), group):
                    idx = order[b : b + group]
                    results, tokens = regenerate_batch(engine, tokenizer, [shard[i][1] for i in idx], args)
                    for i, (chat, done) in zip(idx, results, strict=True):
                        rows[i] = {"messages": chat, "source": shard[i][0], "finished": done}
                        unfinished += not done
                    progress.advance(len(idx), tokens)
                _write_shard(out / f"shard-{k:05d}.jsonl", [rows[i] for i in range(len(shard))])
                shards_written += 1
        except KeyboardInterrupt:
            print(f"{progress.line()}; interrupted: {shards_written} shards complete, the shard in progress is "
                  "lost; rerun the same command to continue", file=sys.stderr)
            raise
    print(
        f"{n_shards} shards in {out}: {len(todo)} written now, {n_shards - len(todo)} already done; "
        f"{progress.done} conversations regenerated ({unfinished} hit --max-new-tokens), "
        f"{progress.tokens:,} answer tokens at {progress.rate:,.0f} tok/s; "
        f"skipped input records: {skipped or 'none'}"
    )
    if progress.done and unfinished > CUT_SHARE_NOTE * progress.done:
        print(f"note: {unfinished / progress.done:.0%} of the conversations hold an answer cut at --max-new-tokens "
              f"{args.max_new_tokens} before the target ended it; the drafter trains on what is written, so a "
              "larger value gives it the target's whole answers", file=sys.stderr)
    return 0
