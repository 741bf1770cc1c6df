"""vllm_compat: the version gate's parsing and the feature probes, against the installed vLLM,
and BWX_MLA's cache write handing vLLM's `skip_scale` on only where vLLM takes it."""

from __future__ import annotations

import pytest
import torch

from vllm_blackwell_ext import vllm_compat as compat

pytest.importorskip("vllm", reason="the feature probes read the installed vLLM")


@pytest.mark.parametrize(
    "version, series",
    [("0.32.0", (0, 32)), ("0.34.1+cu130", (0, 34)), ("1.0", (1, 0)), ("dev", None), (None, None)],
)
def test_vllm_series_parses_major_and_minor(version, series):
    assert compat.vllm_series(version) == series


def test_supported_text_lists_every_series():
    assert compat.supported_vllm_text() == "0.32.x, 0.33.x, 0.34.x"


def test_installed_vllm_is_supported():
    assert compat.is_supported_vllm(compat.installed_vllm_version())


def test_feature_probes_match_the_installed_series():
    series = compat.vllm_series(compat.installed_vllm_version())
    assert compat.mla_kv_update_takes_skip_scale() is (series >= (0, 33))
    assert compat.has_speculative_method_registry() is (series >= (0, 34))


@pytest.mark.parametrize("takes_skip_scale", [False, True])
def test_mla_cache_write_passes_skip_scale_only_where_vllm_takes_it(monkeypatch, takes_skip_scale):
    from vllm_blackwell_ext.attention import bwx_mla

    impl_cls = bwx_mla.BwxMLAImpl
    base = next(c for c in impl_cls.__mro__[1:] if "do_kv_cache_update" in c.__dict__)
    calls = []
    monkeypatch.setattr(base, "do_kv_cache_update", lambda self, *args: calls.append(args))
    monkeypatch.setattr(bwx_mla, "mla_kv_update_takes_skip_scale", lambda: takes_skip_scale)
    impl = object.__new__(impl_cls)
    # A cache on the meta device takes the non-CPU branch (vLLM's own CUDA write).
    cache = torch.empty(4, 16, 576, device="meta", dtype=torch.uint8)
    rows = (torch.empty(3, 512, device="meta"), torch.empty(3, 1, 64, device="meta"))
    slots, scale = torch.empty(3, device="meta"), torch.empty(1, device="meta")
    impl.do_kv_cache_update(*rows, cache, slots, "fp8", scale, True)
    assert len(calls) == 1
    assert len(calls[0]) == (7 if takes_skip_scale else 6)
    if takes_skip_scale:
        assert calls[0][-1] is True
