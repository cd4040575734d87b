"""`target.path` as a hub id: found in the local Hugging Face cache without any network, one clear
line when it is not there."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockdraft.errors import UserError
from blockdraft.model.locate import locate_model, looks_like_hub_id

SRC = Path(__file__).resolve().parents[2] / "src"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache: Path, repo_id: str, model: Path) -> Path:
    """The layout `hf download` leaves: blobs by content hash, a snapshot of symlinks, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in model.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_hub_ids_are_owner_slash_name_and_paths_are_not():
    assert looks_like_hub_id("Qwen/Qwen3-8B") and looks_like_hub_id("meta-llama/Llama-3.1-8B-Instruct")
    for text in ("/models/Qwen3-8B", "./models/x", "../x/y", "a/b/c", "gpt2", "org/-bad", "a--b/c"):
        assert not looks_like_hub_id(text), text


def test_a_local_folder_is_used_as_it_is(tiny_target):
    assert locate_model(str(tiny_target)) == tiny_target


def test_a_cached_hub_id_resolves_to_its_snapshot(tiny_target, tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = fake_hub_cache(tmp_path / "hub", "acme/tiny", tiny_target)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert locate_model("acme/tiny") == snapshot


def test_an_uncached_hub_id_is_one_line_and_never_a_download(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(UserError) as info:
        locate_model("acme/not-here")
    message = str(info.value)
    assert "\n" not in message and "acme/not-here" in message and str(tmp_path / "empty") in message
    assert "hf download acme/not-here" in message
    with pytest.raises(UserError, match="target folder not found: /no/such/folder"):
        locate_model("/no/such/folder")


def test_load_target_takes_a_hub_id_from_the_cache_named_by_hf_hub_cache(tiny_target, tmp_path):
    """As a user runs it: HF_HUB_CACHE set, HF_HUB_OFFLINE not set, no network needed."""
    fake_hub_cache(tmp_path / "hub", "acme/tiny", tiny_target)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop("HF_HUB_OFFLINE", None)
    code = ("import torch; from blockdraft.model.target import load_target; "
            "t, tok, cfg = load_target('acme/tiny', [1], torch.device('cpu')); "
            "print(cfg.num_hidden_layers, t.layer_ids, tok.mask_token)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["4", "[1]", "<|MASK|>"]
