from blockdraft.doctor.report import render
from tests.doctor import synthetic

from .conftest import analyse


def test_report_has_table_charts_and_shading(tmp_path):
    log, findings = analyse(
        tmp_path, synthetic.generate(3, anomalies=["loss_spike", "checkpoint_stall"], n_steps=1200, style="ours")
    )
    page = render(log, findings)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<table>" in page and "loss_spike" in page and "checkpoint_stall" in page
    assert page.count("data:image/png;base64,") >= 8


def test_report_on_a_sparse_foreign_log(tmp_path):
    log, findings = analyse(tmp_path, synthetic.generate(3, n_steps=800, style="foreign"))
    page = render(log, findings)
    assert "Not checked on this log" in page and page.count("data:image/png;base64,") >= 2


def test_chart_titles_claim_only_what_the_log_has(tmp_path, monkeypatch):
    from blockdraft.doctor import charts
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.readers import load_run
    from tests.doctor.seed_log import seed_incident

    titles: list[str] = []
    real = charts.metric_chart

    def spy(run, findings, name, title, log_y=False):
        titles.append(title)
        return real(run, findings, name, title, log_y)

    monkeypatch.setattr(charts, "metric_chart", spy)
    log, _ = seed_incident(0).write(tmp_path)
    run = load_run(log)
    render(run, diagnose(run))
    assert titles[0] == "loss per record (each the average of a window of steps)"
    titles.clear()
    ours, findings = analyse(tmp_path, synthetic.generate(3, n_steps=800, style="ours"))
    render(ours, findings)
    assert titles[0] == "loss per step (colour = length bucket)"
