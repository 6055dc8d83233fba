"""Ablation reports: mean ± std per grid cell, regressions against a previous launch."""
from orchestrator.report import mean_std, regression, render


def test_mean_and_sample_std():
    assert mean_std([1.0]) == (1.0, 0.0)
    m, s = mean_std([0.9, 1.0, 1.1])
    assert abs(m - 1.0) < 1e-12 and abs(s - 0.1) < 1e-12


def test_table_and_regression_flags():
    now = {"ctl__ndr": {(8,): {"test_acc_at_best": [0.20, 0.22]}, (12,): {"test_acc_at_best": [0.99, 1.0]}}}
    before = {"ctl__ndr": {(8,): {"test_acc_at_best": [0.21, 0.23]}, (12,): {"test_acc_at_best": [1.0, 1.0]}}}
    markdown, page, regressions = render(["n_layers"], now, before)
    assert "| n_layers | seeds | test_acc_at_best |" in markdown
    assert "| 12 | 2 | 0.99 ± 0.01 (was 1.00) |" in markdown
    assert regressions == []  # within noise
    broken = {"ctl__ndr": {(12,): {"test_acc_at_best": [0.50, 0.55]}}}
    _, _, regressions = render(["n_layers"], broken, before)
    assert regressions == ["ctl__ndr {'n_layers': 12} test_acc_at_best: 1.000 -> 0.525"]
    assert "<table" in page


def test_l1_regresses_upwards():
    assert regression("test_l1_at_best", [0.5, 0.5], [0.2, 0.2])
    assert not regression("test_l1_at_best", [0.2, 0.2], [0.5, 0.5])
    assert regression("test_acc_at_best", [0.5, 0.5], [0.9, 0.9])
