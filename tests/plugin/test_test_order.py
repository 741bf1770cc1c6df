"""tests/file_seconds.json orders the suite's files for pytest-xdist (tests/conftest.py): a
renamed or removed file there would silently fall back to the end of the run."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_timed_file_exists_and_the_times_are_seconds():
    seconds = json.loads((REPO / "tests" / "file_seconds.json").read_text())["seconds"]
    assert seconds, "no files listed"
    missing = [path for path in seconds if not (REPO / path).is_file()]
    assert not missing, f"listed in tests/file_seconds.json but not in the tree: {missing}"
    assert all(isinstance(s, int) and s > 0 for s in seconds.values()), seconds
