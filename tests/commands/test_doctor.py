import json
import subprocess
import sys

import pytest

from blockdraft import cli
from tests.doctor import synthetic


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    clean = synthetic.generate(21, n_steps=1500, style="ours").write(root / "clean.jsonl")
    sick = synthetic.generate(21, anomalies=["homogeneous_batches", "nonfinite"], n_steps=1500, style="ours").write(
        root / "sick.jsonl"
    )
    return clean, sick


def test_json_output_has_stable_keys(logs, capsys):
    assert cli.main(["doctor", str(logs[1]), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found and all(set(f) == {"code", "severity", "steps", "summary", "evidence", "advice"} for f in found)
    assert found[0]["severity"] == "error"
    ranks = ["info", "warning", "error"]
    assert [ranks.index(f["severity"]) for f in found] == sorted(
        (ranks.index(f["severity"]) for f in found), reverse=True
    )


def test_fail_on(logs, capsys):
    clean, sick = logs
    assert cli.main(["doctor", str(sick), "--fail-on", "error"]) == 1
    assert cli.main(["doctor", str(clean), "--fail-on", "warning"]) == 0
    out = capsys.readouterr().out
    assert "homogeneous_batches" in out


def test_missing_path_exits_2(tmp_path, capsys):
    assert cli.main(["doctor", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockdraft doctor: error:") and len(err.strip().splitlines()) == 1


def test_html_report(logs, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert cli.main(["doctor", str(logs[1]), "--html", str(out)]) == 0
    text = out.read_text()
    assert text.count("data:image/png;base64,") >= 6
    assert "homogeneous_batches" in text and "http://" not in text and "https://" not in text


def test_follow_on_a_finished_log_returns(logs, capsys):
    assert cli.main(["doctor", str(logs[1]), "--follow", "--fail-on", "error"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any("nonfinite" in line for line in lines)


def test_command_module_imports_nothing_heavy():
    code = (
        "import sys; import blockdraft.commands.doctor; "
        "print(any(m in sys.modules for m in ('torch', 'numpy', 'matplotlib', 'rich')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_doctor_path_imports_neither_torch_nor_transformers(logs):
    code = (
        "import sys; from blockdraft import cli; "
        f"rc = cli.main(['doctor', {str(logs[1])!r}, '--json']); "
        "print(rc, [m for m in ('torch', 'transformers') if m in sys.modules], file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.strip().splitlines()[-1] == "0 []"


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("log.bin", b"\x00\x01\x02 not a log\n\x03\x04\n", "blockdraft doctor reads"),
        ("trainer_state.json", b'{"log_history": 3}', "no log_history"),
        ("export.csv", b"just one column\n1\n", "not a CSV with a header row"),
    ],
)
def test_unreadable_logs_exit_2_naming_the_formats(tmp_path, capsys, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    assert cli.main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_bad_config_file_exits_2(logs, tmp_path, capsys):
    assert cli.main(["doctor", str(logs[0]), "--config", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert cli.main(["doctor", str(logs[0]), "--config", str(bad)]) == 2
    assert "mapping of settings" in capsys.readouterr().err


def test_tensorboard_without_the_package_says_how_to_install(tmp_path, capsys, monkeypatch):
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    for name in ["tensorboard", *(m for m in sys.modules if m.startswith("tensorboard."))]:
        monkeypatch.setitem(sys.modules, name, None)  # an earlier test may have imported its submodules
    assert cli.main(["doctor", str(tmp_path)]) == 2
    assert "pip install 'blockdraft[tensorboard]'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["doctor", "--help"]])
def test_help_imports_neither_torch_nor_transformers(argv):
    code = (
        "import sys; from blockdraft import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers') if m in sys.modules], file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "VERB" in proc.stdout or "RUN_DIR_OR_LOG" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "[]"
