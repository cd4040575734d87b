"""Chat prompts for a real target, made from the Python standard library's functions (no download).

Each documented function or method becomes one instruction (or `--per-function K`, for training),
from templates chosen by a hash of its qualified name: implement it from its signature and docstring,
explain its code, write tests for it, document an undocumented copy, list its edge cases, simplify
it, show example calls, or review it. Prompts are split BY FILE with the demo
corpus's rule (`blockdraft.corpus.part_of`): `train.jsonl` from the files outside the held-out part,
`heldout.jsonl` from the held-out files only, so a drafter is measured on code it never trained on.

    python scripts/make_stdlib_prompts.py --out runs/prompts [--max-train 20000] [--max-heldout 256]

Writes {"messages": [{"role": "user", "content": ...}]} lines (what `blockdraft regenerate` reads)
and `manifest.json` (counts, the Python version whose stdlib was read, the split rule).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sys
from pathlib import Path

from blockdraft.corpus import HELD_OUT_PERCENT, STDLIB, part_of, read_source, stdlib_files

MAX_CODE_LINES = 40
TEMPLATES = (
    "Write a Python function `{signature}` (from the `{module}` module) that does the following: {summary}",
    "Explain what this Python function from `{module}` does, step by step:\n\n```python\n{code}\n```",
    "Write pytest unit tests for this function:\n\n```python\n{code}\n```",
    "Add a clear docstring and type hints to this Python function:\n\n```python\n{bare}\n```",
    "What edge cases and failure modes does this function from `{module}` have?\n\n```python\n{code}\n```",
    "Rewrite this Python function to be simpler and easier to read, keeping its behaviour:\n\n"
    "```python\n{code}\n```",
    "Show three short examples of calling `{signature}` from `{module}` ({summary}), with the expected results.",
    "Review this Python function as a senior engineer would: what would you change and why?\n\n"
    "```python\n{code}\n```",
)


def _pick(name: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") % n


def _without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    copy = ast.FunctionDef(name=node.name, args=node.args, body=body or [ast.Pass()], decorator_list=[],
                           returns=node.returns, type_params=[])
    return ast.unparse(ast.fix_missing_locations(copy))


def prompts_from_source(source: str, module: str, per_function: int = 1) -> list[str]:
    """`per_function` instructions (distinct templates) per documented function of at most
    MAX_CODE_LINES lines."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("__"):
            continue
        doc = ast.get_docstring(node)
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if not doc or len(doc) < 20 or length > MAX_CODE_LINES:
            continue
        code = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        summary = doc.strip().split("\n\n")[0].replace("\n", " ")
        signature = f"{node.name}({ast.unparse(node.args)})"
        qualified = f"{module}.{node.name}:{node.lineno}"
        first = _pick(qualified, len(TEMPLATES))
        for k in range(per_function):
            template = TEMPLATES[(first + k) % len(TEMPLATES)]
            out.append(template.format(signature=signature, module=module, summary=summary, code=code,
                                       bare=_without_docstring(node)))
    return out


def build(split: str, limit: int, seed: int, per_function: int = 1, root: Path | None = None) -> list[str]:
    root = root or STDLIB
    prompts = []
    files = stdlib_files("heldout" if split == "heldout" else "train", root)
    for path in files:
        source = read_source(path)
        if source:
            module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
            prompts.extend(prompts_from_source(source, module, per_function))
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-train", type=int, default=20000)
    ap.add_argument("--max-heldout", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-function", type=int, default=1, metavar="K",
                    help="training prompts per function, each from another template (held-out: always 1)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, limit in (("train", args.max_train), ("heldout", args.max_heldout)):
        prompts = build(split, limit, args.seed, args.per_function if split == "train" else 1)
        with (args.out / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for text in prompts:
                fh.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
        counts[split] = len(prompts)
    manifest = {"counts": counts, "python": sys.version.split()[0], "stdlib": str(STDLIB),
                "split": f"by file: sha256(path relative to the stdlib) % 100 < {HELD_OUT_PERCENT} is held out",
                "seed": args.seed, "per_function": args.per_function, "part_of": part_of.__module__ + ".part_of"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{counts['train']} train and {counts['heldout']} held-out prompts in {args.out}")


if __name__ == "__main__":
    main()
