"""The xdist groups of tests/conftest.py: tests whose shared fixtures overlap stay together."""

from tests.conftest import _shared_groups


def test_overlapping_fixture_sets_form_one_group_and_disjoint_ones_do_not():
    groups = _shared_groups([{"vc"}, {"dist", "vc"}, {"qwen3_runs"}, {"sliding_runs"}, {"dist"}])
    assert groups == ["dist+vc", "dist+vc", "qwen3_runs", "sliding_runs", "dist+vc"]
