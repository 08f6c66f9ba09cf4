"""benchmarks/harness.py: the percentiles the figures were computed with, and the JSON line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from benchmarks import harness


@pytest.mark.parametrize("n", [1, 2, 3, 20, 201])
def test_p95_is_numpys_linear_percentile(n: int) -> None:
    values = [random.Random(n).random() for _ in range(n)]
    assert harness.p95(values) == pytest.approx(float(np.percentile(values, 95)), abs=1e-12)


def test_percentile_is_a_measured_value() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [harness.percentile(values, q) for q in (0, 0.5, 0.9, 1)] == [1.0, 3.0, 5.0, 5.0]


def test_emit_prints_one_line_with_the_machine(capsys: pytest.CaptureFixture) -> None:
    harness.emit({"ratio": 1.5, "machine": {"cpus": 1}})
    harness.emit({"ratio": 2.0}, stderr_too=True)
    out, err = capsys.readouterr()
    first, second = (json.loads(line) for line in out.splitlines())
    assert first == {"ratio": 1.5, "machine": {"cpus": 1}}  # a result's own facts stay
    assert second["ratio"] == 2.0 and second["machine"]["cpus"] >= 1
    assert {"load_avg_1m", "platform", "python"} <= set(second["machine"])
    assert json.loads(err) == second


def test_timed_returns_the_result_and_seconds() -> None:
    out, seconds = harness.timed(sorted, [3, 1, 2])
    assert out == [1, 2, 3] and 0 <= seconds < 5
