import json
import threading
import time

from blockdraft.doctor.follow import follow


def test_follow_picks_up_appended_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(
        "".join(json.dumps({"kind": "step", "step": i, "loss": 1.0, "skipped": False}) + "\n" for i in range(1, 20))
    )
    lines: list[str] = []
    done = threading.Event()

    def writer():
        with path.open("a") as fh:
            fh.write(json.dumps({"kind": "step", "step": 20, "loss": float("nan"), "skipped": False})[:15])
            fh.flush()
            time.sleep(0.2)
            fh.write(json.dumps({"kind": "step", "step": 20, "loss": float("nan"), "skipped": False})[15:] + "\n")
            fh.write(json.dumps({"kind": "run_end", "step": 20, "status": "completed"}) + "\n")
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    found = follow(str(path), {}, poll_s=0.05, emit=lines.append, stop=lambda: False)
    thread.join()
    assert [f.code for f in found] == ["nonfinite"]
    assert len(lines) == 1 and lines[0].startswith("[doctor] ERROR nonfinite @ step 20: ")


def test_follow_lays_the_config_file_over_a_foreign_log(tmp_path):
    from tests.doctor.seed_log import seed_incident

    log = seed_incident(0)
    path, _ = log.write(tmp_path)
    lines: list[str] = []
    follow(str(path), {}, stop=lambda: True, emit=lines.append, settings={"optim": {"betas": [0.9, 0.999]}})
    assert any("optimizer_betas" in line and "WARNING" in line for line in lines)
