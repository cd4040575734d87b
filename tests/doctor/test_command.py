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
        "import sys; import blockdraft.doctor.command; "
        "print(any(m in sys.modules for m in ('torch', 'numpy', 'matplotlib', 'rich')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
