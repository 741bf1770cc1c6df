"""DFlash checkpoint loader: selective shard reading, shape checks, mask embedding files."""

from __future__ import annotations

import pytest
import torch

from vllm_blackwell_ext.dflash.loader import (
    check_draft_tensors,
    expected_draft_shapes,
    read_draft_tensors,
    read_mask_embedding,
)

from ._tiny import random_draft_tensors, tiny_plan, write_draft


def test_single_file_checkpoint_round_trips(tmp_path) -> None:
    cfg, plan = tiny_plan()
    ts = random_draft_tensors(plan)
    write_draft(tmp_path, cfg, ts)
    got = read_draft_tensors(tmp_path, plan)
    assert got.shards_opened == ["model.safetensors"]
    assert set(got.tensors) == set(expected_draft_shapes(plan))
    for k, v in ts.items():
        torch.testing.assert_close(got.tensors[k], v, rtol=0, atol=0)


def test_multi_shard_index_opens_only_shards_holding_draft_tensors(tmp_path) -> None:
    cfg, plan = tiny_plan()
    ts = random_draft_tensors(plan)
    names = sorted(ts)
    half = len(names) // 2
    # Two draft shards plus two shards of unrelated (target) tensors in the same index.
    unrelated = {
        "model-00003-of-00004.safetensors": {"lm_head.weight": torch.zeros(8, 8)},
        "model-00004-of-00004.safetensors": {"embed_tokens.weight": torch.zeros(8, 8)},
    }
    write_draft(tmp_path, cfg, ts, shards=[names[:half], names[half:]], extra_shards=unrelated)
    got = read_draft_tensors(tmp_path, plan)
    assert got.shards_opened == [
        "model-00001-of-00004.safetensors",
        "model-00002-of-00004.safetensors",
    ]
    assert "lm_head.weight" not in got.tensors and len(got.tensors) == len(ts)


def test_prefixed_draft_inside_a_bigger_checkpoint_is_found(tmp_path) -> None:
    cfg, plan = tiny_plan()
    ts = random_draft_tensors(plan)
    write_draft(
        tmp_path,
        cfg,
        ts,
        shards=[sorted(ts)],
        prefix="draft.",
        extra_shards={"target.safetensors": {"model.norm.weight": torch.ones(4)}},
    )
    got = read_draft_tensors(tmp_path, plan, prefixes=("", "draft."))
    assert got.prefix == "draft." and got.shards_opened == ["model-00001-of-00002.safetensors"]


def test_wrongly_sized_fc_is_refused_naming_the_tensor(tmp_path) -> None:
    cfg, plan = tiny_plan()  # 2 target layers -> fc is [H, 2H]
    ts = random_draft_tensors(plan)
    ts["fc.weight"] = torch.zeros(plan.hidden_size, plan.hidden_size)  # the classic [H, H] bug
    write_draft(tmp_path, cfg, ts)
    with pytest.raises(ValueError, match=r"'fc.weight'.*k \* target_hidden_size"):
        read_draft_tensors(tmp_path, plan)


def test_missing_tensor_is_refused_naming_it(tmp_path) -> None:
    cfg, plan = tiny_plan()
    ts = random_draft_tensors(plan)
    del ts["layers.1.self_attn.k_norm.weight"]
    write_draft(tmp_path, cfg, ts)
    with pytest.raises(ValueError, match="layers.1.self_attn.k_norm.weight"):
        read_draft_tensors(tmp_path, plan)


def test_check_draft_tensors_names_bad_projection() -> None:
    _, plan = tiny_plan()
    shapes = {k: v for k, v in expected_draft_shapes(plan).items()}
    shapes["layers.0.self_attn.v_proj.weight"] = (3, plan.hidden_size)
    with pytest.raises(ValueError, match="layers.0.self_attn.v_proj.weight"):
        check_draft_tensors(shapes, plan)


def test_checkpoint_without_weights_is_a_clear_error(tmp_path) -> None:
    _, plan = tiny_plan()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        read_draft_tensors(tmp_path, plan)


@pytest.mark.parametrize("form", ["bare", "bare-2d", "dict"])
def test_mask_embedding_file_forms_are_read(tmp_path, form: str) -> None:
    _, plan = tiny_plan()
    emb = torch.randn(plan.hidden_size)
    payload = {
        "bare": emb,
        "bare-2d": emb[None],
        "dict": {"mask_token_id": plan.mask_token_id, "embedding": emb},
    }[form]
    torch.save(payload, tmp_path / "mask_embedding.pt")
    torch.testing.assert_close(read_mask_embedding(tmp_path, plan), emb, rtol=0, atol=0)


def test_absent_mask_embedding_file_is_none(tmp_path) -> None:
    _, plan = tiny_plan()
    assert read_mask_embedding(tmp_path, plan) is None


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"mask_token_id": 7, "embedding": torch.zeros(64)}, "mask_token_id 7"),
        (torch.zeros(63), "hidden_size 64"),
        ({"emb": torch.zeros(64)}, "'embedding'"),
    ],
    ids=["id-mismatch", "wrong-size", "no-embedding-key"],
)
def test_bad_mask_embedding_file_is_refused(tmp_path, payload, fragment: str) -> None:
    _, plan = tiny_plan()
    torch.save(payload, tmp_path / "mask_embedding.pt")
    with pytest.raises(ValueError, match=fragment):
        read_mask_embedding(tmp_path, plan)
