"""`blockdraft eval` end to end on the tiny target: JSON fields, per-budget entries, lossless greedy
output, the rich table, and one clear error for an empty prompt set."""

import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.model.export import save_drafter


@pytest.fixture(scope="module")
def files(tiny_pair, tmp_path_factory):
    _, drafter, _ = tiny_pair
    root = tmp_path_factory.mktemp("eval")
    save_drafter(drafter.state_dict(), drafter.config, root / "drafter", torch.float32)
    prompts = root / "prompts.jsonl"
    lines = [json.dumps({"text": "def main(args):\n    return"}), "{not json", json.dumps({"text": "import os\n"})]
    prompts.write_text("\n".join(lines) + "\n")
    return root / "drafter", prompts


def test_json_report_has_path_and_budgets(tiny_target, files, capsys):
    drafter, prompts = files
    argv = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--max-new-tokens", "12", "--tree-budget", "4,16", "--json", "--device", "cpu"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 2 and out["skipped_lines"]  # the bad line is counted, not fatal
    assert out["tokens"] == 24 and out["lossless"] is True
    assert 1 <= out["tau"] <= 4 and sum(out["tau_hist"]) > 0 and out["speedup"] > 0
    assert [(m["mode"], m["budget"]) for m in out["modes"]] == [("path", None), ("tree", 4), ("tree", 16)]
    assert all(m["lossless"] for m in out["modes"])
    assert len(out["modes"][1]["accept_per_pos"]) == 3


def test_table_and_sampled_mode(tiny_target, files, capsys):
    drafter, prompts = files
    argv = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--max-new-tokens", "6", "--limit", "1", "--temperature", "0.8", "--tree-budget", "8", "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "blockdraft eval: 1 prompts" in out and "tree 8" in out and "tau histogram" in out


def test_sampled_mode_reports_the_one_prompt_at_a_time_it_decodes(tiny_target, files, capsys):
    drafter, prompts = files
    argv = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--max-new-tokens", "6", "--temperature", "0.8", "--batch-size", "4", "--json", "--device", "cpu"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["batch_size"], out["cuda_graphs"], out["lossless"]) == (1, False, None)


def test_empty_prompt_set_is_one_clear_error(tiny_target, files, tmp_path, capsys):
    drafter, _ = files
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    argv = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(empty), "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("blockdraft eval: error: no usable prompt") and "\n" not in err


def test_bad_budget_is_a_user_error(tiny_target, files, capsys):
    drafter, prompts = files
    argv = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--tree-budget", "8,x"]
    assert main(argv) == 2
    assert "--tree-budget" in capsys.readouterr().err


def test_batch_size_measures_the_same_path(tiny_target, files, capsys):
    drafter, prompts = files
    base = ["eval", "--target", str(tiny_target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--max-new-tokens", "10", "--json", "--device", "cpu"]
    reports = []
    for size in ("1", "2"):
        assert main([*base, "--batch-size", size]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    one, two = reports
    assert two["batch_size"] == 2 and two["lossless"] is True
    assert (two["tau"], two["tau_hist"], two["tokens"]) == (one["tau"], one["tau_hist"], one["tokens"])
