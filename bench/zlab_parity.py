"""Decode an export with z-lab's reference implementation (PyPI `dflash==0.1.0`) and with
`blockdraft eval`'s single-path decoder on the same prompts; report how often they agree.

    python bench/zlab_parity.py --target DIR --drafter EXPORT --prompts heldout.jsonl [--limit 16]
        [--max-new-tokens 128] [--dtype float32|bfloat16] [--device cuda]

Greedy. In float32 both must emit the same tokens and the same acceptance length every round; in
bfloat16 the two compute the same math in another order, so a near-tie can flip a token: the report
gives the share of identical prompts and of identical rounds before each prompt's first difference.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", required=True, nargs="+")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    import dflash.model as reference_impl

    from blockdraft.config import EvalConfig
    from blockdraft.evaluate.prompts import load_prompts
    from blockdraft.evaluate.speculative import speculative_greedy
    from blockdraft.model.export import load_drafter
    from blockdraft.model.target import load_target

    if args.device == "cpu":
        reference_impl._cuda_time = time.perf_counter  # its stats timer syncs CUDA
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    drafter = load_drafter(args.drafter, device, dtype)
    target, tok, _ = load_target(args.target, drafter.target_layer_ids, device, args.dtype)
    reference = reference_impl.DFlashDraftModel.from_pretrained(args.drafter, dtype=dtype).to(device).eval()
    cfg = EvalConfig(prompts=args.prompts, max_prompts=args.limit, max_new_tokens=args.max_new_tokens,
                     prompt_tokens=args.prompt_tokens)
    prompts, _ = load_prompts(args.prompts, tok, cfg)
    eos = tok.eos_token_id
    same_prompts, same_rounds, rounds, rows = 0, 0, 0, []
    for prompt in prompts:
        ours = speculative_greedy(target, drafter, prompt, args.max_new_tokens, eos)
        theirs = reference_impl.dflash_generate(reference, target.model, torch.tensor([prompt], device=device),
                                                args.max_new_tokens, [eos] if eos is not None else None,
                                                return_stats=True)
        their_tokens = theirs.output_ids[0, len(prompt):].tolist()[: len(ours.tokens)]
        agree = 0
        for a, b in zip(ours.acceptance, theirs.acceptance_lengths, strict=False):
            if a != b:
                break
            agree += 1
        same = their_tokens == ours.tokens and ours.acceptance == theirs.acceptance_lengths[: len(ours.acceptance)]
        same_prompts += same
        same_rounds += agree
        rounds += len(ours.acceptance)
        rows.append({"same": same, "rounds": len(ours.acceptance), "rounds_agreeing": agree,
                     "tau_ours": ours.tau, "tau_reference": sum(theirs.acceptance_lengths) /
                     max(1, len(theirs.acceptance_lengths))})
    print(json.dumps({"dtype": args.dtype, "device": args.device, "prompts": len(prompts),
                      "identical_prompts": same_prompts, "rounds_agreeing_share": same_rounds / max(1, rounds),
                      "tau_ours": sum(r["tau_ours"] for r in rows) / max(1, len(rows)),
                      "tau_reference": sum(r["tau_reference"] for r in rows) / max(1, len(rows)),
                      "per_prompt": rows}))


if __name__ == "__main__":
    main()
