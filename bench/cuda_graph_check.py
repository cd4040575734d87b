"""On a GPU: every decoder replaying CUDA graphs emits what it emits eagerly, and what plain greedy
decoding emits, on tiny random targets of two architectures (Llama; Gemma 3 with a sliding window
shorter than the prompts), in fp32. Prints one JSON object: per architecture and decoder, whether
tokens and acceptance lengths match, and eager vs graphed seconds.

    python bench/cuda_graph_check.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from blockdraft.evaluate.ddtree import TreeDecoder
from blockdraft.evaluate.speculative import SpeculativeDecoder, TargetDecoder
from blockdraft.model.drafter import DFlashDrafter, drafter_config
from blockdraft.model.target import Target

VOCAB, NEW, BLOCK = 512, 40, 8
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)


def build(arch: str, device: torch.device) -> tuple[Target, DFlashDrafter]:
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True))
    else:
        cfg = Gemma3TextConfig(**SHAPE, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2)
        model = Gemma3ForCausalLM(cfg)
    model = model.to(device).eval()
    target = Target(model, [0, 2])
    drafter = DFlashDrafter(drafter_config(model.config, 2, BLOCK, [0, 2], 3)).to(device).eval()
    return target, drafter


@torch.no_grad()
def plain_greedy(target: Target, prompt: list[int]) -> list[int]:
    ids, device = list(prompt), target.embed_tokens.weight.device
    for _ in range(NEW):
        ids.append(int(target.model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].argmax()))
    return ids[len(prompt):]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def decoders(target: Target, drafter: DFlashDrafter, longest: int, graphs: bool) -> dict:
    """name -> (decoder, how it decodes the prompts)."""
    def one(d, prompts):
        return [d.decode([p], NEW, None)[0] for p in prompts]

    def together(d, prompts):
        return d.decode(prompts, NEW, None)

    def trees(d, prompts):
        return [d.decode(p, NEW, None) for p in prompts]

    return {
        "target n=1": (TargetDecoder(target, 1, longest, NEW, graphs), one),
        "target n=3": (TargetDecoder(target, 3, longest, NEW, graphs), together),
        "path n=1": (SpeculativeDecoder(target, drafter, 1, longest, NEW, graphs), one),
        "path n=3": (SpeculativeDecoder(target, drafter, 3, longest, NEW, graphs), together),
        "tree 8": (TreeDecoder(target, drafter, 8, longest, NEW, graphs), trees),
        f"tree {VOCAB + 8}": (TreeDecoder(target, drafter, VOCAB + 8, longest, NEW, graphs), trees),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    device = torch.device(ap.parse_args().device)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (13, 21, 30)]
    report = {}
    for arch in ("llama", "gemma3"):
        target, drafter = build(arch, device)
        refs = [plain_greedy(target, p) for p in prompts]
        longest = max(map(len, prompts))
        eager_set = decoders(target, drafter, longest, False)
        graph_set = decoders(target, drafter, longest, True)
        rows = {}
        for name, (eager_dec, run) in eager_set.items():
            graph_dec = graph_set[name][0]
            run(graph_dec, prompts)  # capture
            seconds = []
            for dec in (eager_dec, graph_dec):
                sync(device)
                t0 = time.perf_counter()
                outs = run(dec, prompts)
                sync(device)
                seconds.append(time.perf_counter() - t0)
                if dec is eager_dec:
                    eager = outs
            rows[name] = {
                "tokens_equal_plain_greedy": [o.tokens for o in outs] == refs,
                "graphed_equals_eager": [(o.tokens, o.acceptance) for o in outs]
                == [(e.tokens, e.acceptance) for e in eager],
                "max_tau": max((max(o.acceptance) for o in outs if o.acceptance), default=None),
                "eager_s": round(seconds[0], 4),
                "graphed_s": round(seconds[1], 4),
                "graphs": graph_dec.graphs.captured,
            }
        report[arch] = rows
    report["ok"] = all(r["tokens_equal_plain_greedy"] and r["graphed_equals_eager"]
                       for arch in ("llama", "gemma3") for r in report[arch].values())
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
