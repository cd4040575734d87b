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
