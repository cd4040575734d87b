"""Targets other than Qwen3, as a user brings them: a SmolLM2-shaped Llama (tied head, chat template,
no mask token), and Gemma 3 (scaled embeddings, sliding-window layers, RoPE per layer type), Qwen2,
Phi-3, Qwen3-MoE and Gemma 2 (conftest.MORE_ARCHITECTURES). Each trains, exports,
and decodes losslessly; the export decodes the same tokens with z-lab's reference implementation
(`dflash`, when installed). Targets with recurrent layers (conftest.RECURRENT_ARCHITECTURES) train,
evaluate and decode on the greedy single path."""

import json
import time

import pytest
import torch

from blockdraft.cli import main
from blockdraft.errors import UserError
from blockdraft.evaluate.runner import evaluate
from blockdraft.evaluate.speculative import speculative_greedy
from blockdraft.model.export import load_drafter
from blockdraft.model.target import load_target, open_target, resolve_mask_token
from blockdraft.train.loop import Trainer
from tests.conftest import MORE_ARCHITECTURES, RECURRENT_ARCHITECTURES, make_config

ARCHES = ["tiny_llama_target", *MORE_ARCHITECTURES]


@pytest.fixture(scope="module", params=ARCHES)
def exported(request, tiny_corpus, tiny_target_of, tmp_path_factory):
    """(target folder, run config, export folder) after a 4-update run."""
    name = request.param
    target = tiny_target_of(name) if name in MORE_ARCHITECTURES else request.getfixturevalue(name)
    root = tmp_path_factory.mktemp(request.param)
    cfg = make_config(target, tiny_corpus, root, train={"max_steps": 4, "save_every": 100})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    trainer.prefetcher.close()
    out = root / "export"
    assert main(["export", cfg.train.out_dir, "--out", str(out), "--dtype", "float32"]) == 0
    return target, cfg, out


def test_llama_without_mask_token_gets_a_spare_special_token(tiny_llama_target):
    _, hf_cfg, tok = open_target(tiny_llama_target)
    token_id, note = resolve_mask_token(tok, hf_cfg.vocab_size, True, None)
    assert tok.convert_ids_to_tokens(token_id) == "<spare>"  # not eos/pad, not written by the chat template
    assert "no mask token" in note and "drafter.mask_token_id" in note


def test_a_mask_id_from_another_recipe_fails_before_any_work(tiny_llama_target, tiny_corpus, tmp_path, capsys):
    cfg = make_config(tiny_llama_target, tiny_corpus, tmp_path, drafter={"mask_token_id": 151669})
    with pytest.raises(Exception) as err:
        Trainer(cfg, show_console=False)
    assert "outside the target's embedding table" in str(err.value) and "spare special token" in str(err.value)
    assert not (tmp_path / "cache").exists()  # refused before the data was tokenised


def test_training_logs_the_chosen_mask_token(tiny_llama_target, tiny_corpus, tmp_path):
    cfg = make_config(tiny_llama_target, tiny_corpus, tmp_path, train={"max_steps": 1})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    trainer.prefetcher.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    codes = [r.get("code") for r in records if r["kind"] == "warning"]
    assert "mask_token_chosen" in codes


def test_export_carries_what_readers_need(exported):
    target, _, out = exported
    config = json.loads((out / "config.json").read_text())
    dflash = config["dflash_config"]
    assert dflash["target_hidden_states"] == "decoder_layer_output"
    target_cfg = json.loads((target / "config.json").read_text())
    scaled = target_cfg["model_type"].startswith("gemma")  # Gemma 2 and 3 scale embeddings by sqrt(hidden)
    assert dflash["input_embedding_scale"] == pytest.approx(target_cfg["hidden_size"] ** 0.5 if scaled else 1.0)
    rope = target_cfg["rope_parameters"]
    assert config["rope_theta"] == rope.get("full_attention", rope)["rope_theta"]  # Gemma 3: per layer type


def test_speculators_export_warns_of_the_embedding_scale_it_cannot_carry(exported, tmp_path, capsys):
    target, cfg, _ = exported
    out = tmp_path / "spec"
    assert main(["export", cfg.train.out_dir, "--out", str(out), "--format", "speculators"]) == 0
    assert (out / "model.safetensors").is_file()  # written all the same: the user asked for this format
    err = capsys.readouterr().err
    scaled = json.loads((target / "config.json").read_text())["model_type"].startswith("gemma")
    assert ("input_embedding_scale" in err) == scaled
    if scaled:
        assert err.startswith("warning: the speculators format has no field") and err.count("\n") == 1


def test_teacher_logits_are_the_targets_own(exported):
    """What the loss takes as the target's logits for KL (its final hidden state through the lm_head,
    then its soft-cap when it has one: Gemma 2) are the logits the target itself returns."""
    target_dir, _, out = exported
    drafter = load_drafter(out)
    target, tok, hf_cfg = load_target(target_dir, drafter.target_layer_ids, torch.device("cpu"), "float32")
    ids = torch.tensor(_prompts(tok, 1))
    _, final = target.features(ids, final_hidden=True)
    logits = final[0] @ target.lm_head.weight.T
    if (cap := target.logit_softcap) is not None:
        logits = cap * torch.tanh(logits / cap)
    assert (cap is not None) == (hf_cfg.model_type == "gemma2")
    with torch.no_grad():
        torch.testing.assert_close(logits, target.model(ids).logits[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(RECURRENT_ARCHITECTURES))
def test_a_target_with_recurrent_layers_trains_evaluates_and_decodes_losslessly(name, tiny_target_of, tiny_corpus,
                                                                                tmp_path, capsys):
    from blockdraft.telemetry.log import read_log

    target = tiny_target_of(name)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": "def parse(text):\n    return text.split()"}) + "\n")
    cfg = make_config(target, tiny_corpus, tmp_path, train={"max_steps": 2, "save_every": 100, "eval_every": 2},
                      eval={"prompts": [str(prompts)], "max_new_tokens": 16})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    trainer.prefetcher.close()
    (evaluated,) = [r for r in read_log(tmp_path / "run" / "log.jsonl") if r["kind"] == "eval"]
    assert evaluated["lossless"] is True and evaluated["tau"] >= 1 and evaluated["mode"] == "path"
    out = tmp_path / "export"
    assert main(["export", cfg.train.out_dir, "--out", str(out)]) == 0
    eval_args = ["eval", "--target", str(target), "--drafter", str(out), "--prompts", str(prompts), "--quiet"]
    capsys.readouterr()
    assert main([*eval_args, "--json", "--max-new-tokens", "16", "--batch-size", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lossless"] is True and summary["tokens"] == 16 and len(summary["modes"]) == 1
    assert summary["batch_size"] == 1  # decoded one prompt at a time, as reported
    for extra, refused in ((["--tree-budget", "4"], "DDTree"), (["--temperature", "0.7"], "sampled decoding")):
        assert main([*eval_args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"decodes greedily on the single path only, without {refused}" in err[0]


def test_a_target_with_layers_neither_decoder_runs_is_refused_in_one_line(tiny_target, tiny_corpus, tmp_path,
                                                                           monkeypatch):
    import transformers

    with_eval = make_config(tiny_target, tiny_corpus, tmp_path, eval={"prompts": [str(tiny_corpus)]})
    real = transformers.AutoConfig.from_pretrained

    def chunked(*args, **kwargs):
        cfg = real(*args, **kwargs)
        cfg.layer_types = ["chunked_attention"] * cfg.num_hidden_layers
        return cfg

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", chunked)
    with pytest.raises(UserError, match="^eval.prompts: this target has chunked_attention layers, which blockdraft"):
        Trainer(with_eval, show_console=False)  # refused before the data is tokenised or a weight loads
    assert not (tmp_path / "cache").exists()


def _prompts(tok, n=3):
    texts = ["def parse(text):\n    ", "import os\n\nclass Path:\n", "for item in items:\n    if item"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:n]]


def test_decoding_is_lossless_on_every_mode(exported):
    target_dir, cfg, out = exported
    drafter = load_drafter(out)
    target, tok, _ = load_target(target_dir, drafter.target_layer_ids, torch.device("cpu"), "float32")
    prompts = _prompts(tok)
    for batch_size in (1, 3):
        results, _ = evaluate(target, drafter, prompts, 24, None, [8], batch_size=batch_size)
        assert all(r.lossless for r in results), [(r.mode, r.budget) for r in results if not r.lossless]
        assert all(r.tokens == 24 * len(prompts) for r in results)


def test_zlab_reference_accepts_the_same_tokens(exported, monkeypatch):
    """z-lab's own decoder reads our export and emits the same tokens and acceptance lengths (fp32)."""
    model_mod = pytest.importorskip("dflash.model")
    monkeypatch.setattr(model_mod, "_cuda_time", time.perf_counter)  # its stats timer syncs CUDA
    target_dir, _, out = exported
    drafter = load_drafter(out)
    target, tok, _ = load_target(target_dir, drafter.target_layer_ids, torch.device("cpu"), "float32")
    reference = model_mod.DFlashDraftModel.from_pretrained(str(out), dtype=torch.float32).eval()
    for prompt in _prompts(tok):
        ours = speculative_greedy(target, drafter, prompt, 24, None)
        theirs = model_mod.dflash_generate(reference, target.model, torch.tensor([prompt]), 24, None,
                                           return_stats=True)
        new = theirs.output_ids[0, len(prompt):].tolist()
        assert new[: len(ours.tokens)] == ours.tokens
        assert theirs.acceptance_lengths[: len(ours.acceptance)] == ours.acceptance
