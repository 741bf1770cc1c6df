"""Results are data: every results JSON fits the harness's one schema, and every table beside it
is drawn from that JSON alone (no figure in a .md that the JSON lacks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import harness

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
JSONS = sorted(RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", JSONS, ids=[p.name for p in JSONS])
def test_results_json_fits_the_schema_and_draws_its_markdown(path):
    data = harness.load_results(path)
    assert path.name.startswith(f"{data['gpu']}-{data['op']}")  # or a renamed copy
    assert path.with_suffix(".md").read_text() == harness.markdown(data)


def test_report_writes_the_json_then_draws_from_it(tmp_path):
    rows = [
        harness.Row("B=1", "us", 2.0, {"peer": 4.0}, None),
        harness.Row("B=8", "GB/s", 900.0, {"peer": 450.0}, 1000.0),
    ]
    path = harness.report(rows, "cpu", "demo", "cmd", tmp_path, notes=["n"], extra={"raw": [1]})
    data = json.loads(path.read_text())
    assert data["schema"] == harness.SCHEMA and data["extra"] == {"raw": [1]}
    assert data["rows"][0] == {"case": "B=1", "metric": "us", "ours": 2.0,
                               "peers": {"peer": 4.0}, "roofline": None}  # fmt: skip
    md = path.with_suffix(".md").read_text()
    assert md == harness.markdown(harness.load_results(path))
    assert "| B=8 | GB/s | 900.0 | 450.0 | 1000.0 | 2 | 0.9 |" in md


def test_load_results_names_what_does_not_fit(tmp_path):
    path = tmp_path / "cpu-x.json"
    path.write_text(json.dumps({"gpu": "cpu", "op": "x", "command": "c", "rows": [], "blob": 1}))
    with pytest.raises(ValueError, match=r"missing \['notes'\], unexpected \['blob'\]"):
        harness.load_results(path)
