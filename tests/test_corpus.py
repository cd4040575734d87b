"""The demo corpus split: by file, stable, and the three parts never overlap."""

from __future__ import annotations

import pytest

from blockdraft.corpus import DRAFTER_PERCENT, HELD_OUT_PERCENT, part_of, stdlib_files


@pytest.fixture
def fake_stdlib(tmp_path):
    for i in range(600):
        path = tmp_path / f"pkg{i % 7}" / f"mod_{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"x = {i}\n")
    skipped = tmp_path / "site-packages" / "third_party.py"
    skipped.parent.mkdir()
    skipped.write_text("y = 1\n")
    return tmp_path


def test_parts_partition_the_files(fake_stdlib):
    target, drafter, held = (set(stdlib_files(s, fake_stdlib)) for s in ("target", "drafter", "heldout"))
    assert not (target & drafter) and not (target & held) and not (drafter & held)
    assert set(stdlib_files("train", fake_stdlib)) == target | drafter
    assert len(target | drafter | held) == 600  # site-packages is not the standard library


def test_parts_have_their_shares(fake_stdlib):
    n = {s: len(stdlib_files(s, fake_stdlib)) for s in ("target", "drafter", "heldout")}
    assert abs(n["heldout"] / 600 - HELD_OUT_PERCENT / 100) < 0.05
    assert abs(n["drafter"] / 600 - DRAFTER_PERCENT / 100) < 0.07


def test_part_depends_on_the_relative_path_alone(fake_stdlib, tmp_path_factory):
    """The same relative path lands in the same part under any stdlib folder (any machine, any Python)."""
    other = tmp_path_factory.mktemp("other-python")
    for path in stdlib_files("heldout", fake_stdlib)[:5]:
        rel = path.relative_to(fake_stdlib)
        (other / rel).parent.mkdir(parents=True, exist_ok=True)
        (other / rel).write_text("z = 0\n")
        assert part_of(rel.as_posix()) == "heldout"
    assert len(stdlib_files("heldout", other)) == 5


def test_unknown_split_is_refused(fake_stdlib):
    with pytest.raises(ValueError, match="split must be one of"):
        stdlib_files("validation", fake_stdlib)
