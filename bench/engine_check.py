"""Check exports against the engines' own config parsing and weight-name mapping, on the CPU.

    python bench/engine_check.py --tiny                      # build a tiny target + drafter, export both
    python bench/engine_check.py --dflash DIR --spec DIR [--target DIR_OR_ID]

Each engine is imported if installed, else skipped with one line (none is a blockdraft dependency):
- speculators (pure Python; `pip install --no-deps speculators==0.9.0` plus loguru, pydantic-settings,
  openai, httpx2, datasets, multiprocess, pandas, dill, hs-connectors is enough on the CPU):
  its DFlashSpeculatorConfig reads the speculators export; its DFlashDraftModel takes our tensors
  (no unexpected names, only verifier-owned ones missing) and, built from them, computes the same
  drafter output as ours (eager attention, whole block and context visible); its DFlash converter
  turns the dflash export into the same config fields as our speculators export.
- vllm: SpeculatorsConfig turns the speculators export into its draft config (DFlashDraftModel,
  dflash_config.target_layer_ids = ours, no causal override that makes a layer causal, method dflash,
  B-1 speculative tokens); the registry knows DFlashDraftModel; DFlashQwen3Model's weight mapper
  maps every tensor of ours.
- sglang: parse_dflash_draft_config reads the dflash export (block size, mask token, taps).
Exit code 1 when a check that ran failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILED.append(what)


def skip(engine: str, exc: Exception) -> None:
    print(f"{engine}: skipped (not importable: {type(exc).__name__}: {str(exc)[:120]})")


def build_tiny(root: Path) -> tuple[Path, Path, Path]:
    """A random 4-layer Qwen3 target and a random 2-layer drafter, exported in both formats."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from blockdraft.model.drafter import DFlashDrafter, drafter_config
    from blockdraft.model.export import save_drafter
    from blockdraft.model.export_speculators import save_speculators

    torch.manual_seed(0)
    tcfg = Qwen3Config(vocab_size=300, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=512,
                       architectures=["Qwen3ForCausalLM"], rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 1e6})
    target = root / "target"
    Qwen3ForCausalLM(tcfg).save_pretrained(target)
    drafter = DFlashDrafter(drafter_config(tcfg, 2, 8, [1, 2], 299))
    for p in drafter.parameters():
        torch.nn.init.normal_(p, std=0.2)  # norms too, so a swapped tensor cannot pass unnoticed
    state, cfg = drafter.state_dict(), drafter.config.to_dict()
    dflash = save_drafter(state, cfg, root / "dflash", torch.float32)
    spec = save_speculators(state, cfg, root / "spec", torch.float32, str(target), ["Qwen3ForCausalLM"])
    return target, dflash, spec


def check_speculators(dflash: Path | None, spec: Path | None, target: str | None) -> None:
    try:
        from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    except Exception as exc:  # any import failure: not usable here
        return skip("speculators", exc)
    from importlib.metadata import version

    print(f"speculators {version('speculators')}")
    try:
        from loguru import logger

        logger.remove()
        logger.add(sys.stderr, level="WARNING")
    except ImportError:
        pass
    from blockdraft.model.export import load_drafter

    ours = None
    if spec is not None:
        raw = json.loads((spec / "config.json").read_text())
        cfg = DFlashSpeculatorConfig.from_pretrained(str(spec))
        check(isinstance(cfg, DFlashSpeculatorConfig), "speculators export parses as DFlashSpeculatorConfig")
        check(cfg.sliding_window_non_causal is True, "sliding_window_non_causal read back true")
        check(cfg.aux_hidden_state_layer_ids == raw["aux_hidden_state_layer_ids"], "aux layer ids read back")
        check(cfg.transformer_layer_config.num_hidden_layers == len(cfg.transformer_layer_config.layer_types),
              "layer_types has one entry per drafter layer")
        tensors = load_file(spec / "model.safetensors")
        cfg.transformer_layer_config._attn_implementation = "eager"  # mask None: everything visible
        model = DFlashDraftModel(cfg).eval()
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        verifier_owned = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
        check(not unexpected, f"no tensor name unknown to DFlashDraftModel (unexpected: {unexpected[:3]})")
        check(set(missing) <= verifier_owned, f"only verifier-owned tensors missing ({sorted(missing)})")
        if dflash is not None:
            ours = load_drafter(dflash)
            check(_same_output(model, ours), "speculators' DFlashDraftModel computes our drafter's output")
    if dflash is not None and spec is not None and target is not None:
        from speculators.convert.dflash import DFlashConverter

        with tempfile.TemporaryDirectory() as tmp:
            try:
                DFlashConverter().convert(str(dflash), tmp, base_model=target, validate=False)
            except Exception as exc:
                check(False, f"speculators' converter takes the dflash export ({type(exc).__name__}: {exc})")
                return
            conv = json.loads((Path(tmp) / "config.json").read_text())
            raw = json.loads((spec / "config.json").read_text())
            for key in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size", "draft_vocab_size"):
                check(conv.get(key) == raw.get(key), f"converter's {key} = ours ({conv.get(key)} vs {raw.get(key)})")
            check(conv["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
                  == raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
                  "converter's speculative_tokens = ours")
            print(f"       (the converter writes sliding_window_non_causal={conv.get('sliding_window_non_causal')};"
                  " ours is true)")
            theirs = load_file(Path(tmp) / "model.safetensors")
            mine = load_file(spec / "model.safetensors")
            body = {k for k in theirs if not k.startswith(("embed_tokens", "lm_head", "verifier_"))}
            check(body == set(mine) and all(theirs[k].equal(mine[k]) for k in body),
                  "converter's drafter tensors = ours (names and values)")


def _same_output(model, ours) -> bool:
    """Run speculators' modules by hand (fc, hidden_norm, layers, norm) against our drafter."""
    torch.manual_seed(1)
    h, n_taps = ours.config.hidden_size, len(ours.target_layer_ids)
    t, q = 7, ours.block_size
    taps, noise = torch.randn(1, t, h * n_taps), torch.randn(1, q, h)
    positions = torch.arange(t + q)[None]
    with torch.no_grad():
        ctx = model.hidden_norm(model.fc(taps))
        rope = model.rotary_emb(noise, positions)
        x = noise
        for layer in model.layers:
            x = layer(target_hidden=ctx, hidden_states=x, attention_mask=None, position_embeddings=rope)
        theirs = model.norm(x)
        mine = ours(noise, positions[:, t:], ours.fuse(taps), positions[:, :t])
    err = (theirs - mine).abs().max().item()
    print(f"       max |difference| {err:.2e}")
    return err < 1e-5


def check_vllm(dflash: Path | None, spec: Path | None) -> None:
    try:
        import vllm
        from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
    except Exception as exc:
        return skip("vllm", exc)
    print(f"vllm {vllm.__version__}")
    if spec is not None:
        raw = json.loads((spec / "config.json").read_text())
        pre = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(raw)))
        check(pre.get("architectures") == ["DFlashDraftModel"], "draft architecture DFlashDraftModel")
        ids = [i - 1 for i in raw["aux_hidden_state_layer_ids"]]
        check((pre.get("dflash_config") or {}).get("target_layer_ids") == ids, f"dflash_config.target_layer_ids {ids}")
        causal = (pre.get("dflash_config") or {}).get("causal")
        check(causal in (False, None) and set(pre.get("layer_types") or ["full_attention"]) == {"full_attention"},
              f"no layer served causal (dflash_config.causal={causal})")
        spec_cfg = SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(raw)))
        check(spec_cfg.get("method") == "dflash", f"method {spec_cfg.get('method')}")
        check(spec_cfg.get("num_speculative_tokens") == raw["block_size"] - 1, "num_speculative_tokens = B-1")
    try:
        from vllm.model_executor.models import ModelRegistry

        check("DFlashDraftModel" in ModelRegistry.get_supported_archs(), "registry knows DFlashDraftModel")
        from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

        folder = spec or dflash
        names = ["model." + k for k in load_file(folder / "model.safetensors")]
        mapped = [n for n, _ in DFlashQwen3Model.hf_to_vllm_mapper.apply((n, None) for n in names)]
        check(len(mapped) == len(names) and all(n is not None for n in mapped), "weight mapper maps every tensor")
    except Exception as exc:
        print(f"  (model-side checks skipped: {type(exc).__name__}: {str(exc)[:120]})")


def check_sglang(dflash: Path | None) -> None:
    try:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    except Exception as exc:
        return skip("sglang", exc)
    print("sglang")
    if dflash is None:
        return
    raw = json.loads((dflash / "config.json").read_text())
    parsed = parse_dflash_draft_config(draft_hf_config=raw)
    check(getattr(parsed, "block_size", None) == raw["block_size"], "block_size")
    check(getattr(parsed, "mask_token_id", None) == raw["dflash_config"]["mask_token_id"], "mask_token_id")
    check(list(getattr(parsed, "target_layer_ids", [])) == raw["dflash_config"]["target_layer_ids"], "target_layer_ids")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="build a tiny random target and drafter, export both")
    ap.add_argument("--dflash", type=Path, help="a `blockdraft export` folder (dflash format)")
    ap.add_argument("--spec", type=Path, help="a `blockdraft export --format speculators` folder")
    ap.add_argument("--target", help="the target (folder or cached id), for speculators' converter")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dflash, spec, target = args.dflash, args.spec, args.target
        if args.tiny:
            t, dflash, spec = build_tiny(Path(tmp))
            target = str(t)
        if dflash is None and spec is None:
            ap.error("give --tiny, or --dflash and/or --spec")
        check_speculators(dflash, spec, target)
        check_vllm(dflash, spec)
        check_sglang(dflash)
    print(f"{len(FAILED)} failed" if FAILED else "all checks that ran passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
