"""Read a DFlash draft checkpoint: only the shards and tensors the draft needs, every shape checked.

A draft may ship as one `model.safetensors`, or as shards with `model.safetensors.index.json`
(sometimes inside a bigger checkpoint, under a name prefix). We read the index, keep the names
the plan needs, open only the shards that hold them, and check each shape against the plan
before reading the data, so a wrongly sized `fc` (the classic: [H, H] instead of [H, k*H]) fails
with the tensor's name instead of deep inside a matmul. Imports nothing from vLLM.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

from .config import DFlashPlan

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MASK_EMBEDDING_FILE = "mask_embedding.pt"

__all__ = [
    "DraftTensors",
    "expected_draft_shapes",
    "check_draft_tensors",
    "read_draft_tensors",
    "read_mask_embedding",
    "parse_mask_embedding",
]


def expected_draft_shapes(plan: DFlashPlan) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape (nn.Linear [out, in] layout) of every tensor the draft needs."""
    h, hd = plan.hidden_size, plan.head_dim
    q, kv = plan.num_attention_heads * hd, plan.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": plan.fc_shape,
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(plan.num_hidden_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (plan.intermediate_size, h),
            p + "mlp.up_proj.weight": (plan.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, plan.intermediate_size),
        }
        if plan.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.bias": (h,),
            }
        if plan.attention_sink_bias:
            shapes[p + "self_attn.attention_sink_bias"] = (plan.num_attention_heads,)
    return shapes


def _shape_error(
    name: str, expected: tuple[int, ...], got: tuple[int, ...], plan: DFlashPlan
) -> str:
    msg = f"DFlash draft tensor {name!r} has shape {list(got)}, expected {list(expected)}"
    if name == "fc.weight":
        msg += (
            f" ([hidden_size, k * target_hidden_size] for k = {plan.num_target_features} "
            f"target_layer_ids {list(plan.target_layer_ids)})"
        )
    return msg


def check_draft_tensors(shapes: Mapping[str, Iterable[int]], plan: DFlashPlan) -> None:
    """Raise ValueError naming the first missing or mis-shaped tensor."""
    expected = expected_draft_shapes(plan)
    missing = [n for n in expected if n not in shapes]
    if missing:
        raise ValueError(
            f"DFlash draft checkpoint is missing tensor(s) {missing[:4]}"
            + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        )
    for name, exp in expected.items():
        got = tuple(int(d) for d in shapes[name])
        if got != exp:
            raise ValueError(_shape_error(name, exp, got, plan))


@dataclass
class DraftTensors:
    """What `read_draft_tensors` returns: the tensors (checkpoint names, prefix stripped) and
    which shard files were opened (so tests can count them)."""

    tensors: dict[str, torch.Tensor]
    shards_opened: list[str] = field(default_factory=list)
    prefix: str = ""


def _weight_map(ckpt_dir: str) -> dict[str, str]:
    index_path = os.path.join(ckpt_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
        wm = index.get("weight_map")
        if not isinstance(wm, dict):
            raise ValueError(f"{index_path} has no 'weight_map' mapping")
        return wm
    single = os.path.join(ckpt_dir, SINGLE_FILE)
    if not os.path.isfile(single):
        raise FileNotFoundError(
            f"DFlash draft checkpoint {ckpt_dir!r} has neither {INDEX_FILE} nor {SINGLE_FILE}"
        )
    with safe_open(single, framework="pt") as f:
        return {name: SINGLE_FILE for name in f.keys()}  # noqa: SIM118 (safe_open has no iter)


def _find_prefix(names: Iterable[str], prefixes: Iterable[str]) -> str:
    names = set(names)
    for p in prefixes:
        if p + "fc.weight" in names:
            return p
    return next(iter(prefixes), "")


def read_draft_tensors(
    ckpt_dir: str | os.PathLike[str],
    plan: DFlashPlan,
    *,
    prefixes: Iterable[str] = ("", "model."),
    dtype: torch.dtype | None = None,
) -> DraftTensors:
    """Read the draft's tensors from a local checkpoint directory.

    `prefixes` are tried in order; the first under which `fc.weight` exists is the draft's
    (z-lab saves bare names; some exports nest them under `model.` or a draft-specific prefix).
    Only the shards holding needed names are opened; shapes are checked before data is read.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    weight_map = _weight_map(ckpt_dir)
    prefixes = tuple(prefixes)
    prefix = _find_prefix(weight_map, prefixes)
    expected = expected_draft_shapes(plan)

    missing = [n for n in expected if prefix + n not in weight_map]
    if missing:
        raise ValueError(
            f"DFlash draft checkpoint {ckpt_dir!r} is missing tensor(s) "
            f"{[prefix + n for n in missing[:4]]}"
            + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            + (f" (looked under prefixes {list(prefixes)})" if len(prefixes) > 1 else "")
        )

    by_shard: dict[str, list[str]] = {}
    for name in expected:
        by_shard.setdefault(weight_map[prefix + name], []).append(name)

    out = DraftTensors(tensors={}, prefix=prefix)
    for shard in sorted(by_shard):
        path = os.path.join(ckpt_dir, shard)
        out.shards_opened.append(shard)
        with safe_open(path, framework="pt") as f:
            for name in by_shard[shard]:
                got = tuple(f.get_slice(prefix + name).get_shape())
                if got != expected[name]:
                    raise ValueError(_shape_error(prefix + name, expected[name], got, plan))
                t = f.get_tensor(prefix + name)
                out.tensors[name] = t if dtype is None else t.to(dtype)
    return out


def parse_mask_embedding(
    obj: object, plan: DFlashPlan, *, source: str = MASK_EMBEDDING_FILE
) -> torch.Tensor:
    """A `mask_embedding.pt` payload -> [hidden_size] tensor.

    Accepted: a bare tensor of hidden_size elements, or {"embedding": tensor,
    "mask_token_id": int} whose id must equal the plan's (a mismatch means the file belongs to
    another tokenizer/checkpoint).
    """
    if isinstance(obj, Mapping):
        if "embedding" not in obj:
            raise ValueError(
                f"{source} is a dict without an 'embedding' entry (keys: {sorted(obj)})"
            )
        file_id = obj.get("mask_token_id", plan.mask_token_id)
        if file_id != plan.mask_token_id:
            raise ValueError(
                f"{source} mask_token_id {file_id} disagrees with dflash_config.mask_token_id "
                f"{plan.mask_token_id}"
            )
        obj = obj["embedding"]
    if not isinstance(obj, torch.Tensor):
        raise TypeError(
            f"{source} must hold a tensor or {{'mask_token_id', 'embedding'}}; "
            f"got {type(obj).__name__}"
        )
    if obj.numel() != plan.hidden_size:
        raise ValueError(
            f"{source} embedding has {obj.numel()} elements (shape {list(obj.shape)}), "
            f"expected hidden_size {plan.hidden_size}"
        )
    return obj.reshape(plan.hidden_size)


def read_mask_embedding(
    ckpt_dir: str | os.PathLike[str] | None = None,
    plan: DFlashPlan | None = None,
    *,
    data: bytes | None = None,
) -> torch.Tensor | None:
    """Load `<ckpt_dir>/mask_embedding.pt` (or raw file bytes); None when there is none."""
    if plan is None:
        raise TypeError("read_mask_embedding needs plan (a DFlashPlan)")
    if data is None:
        if ckpt_dir is None:
            raise TypeError("read_mask_embedding needs ckpt_dir or data")
        path = os.path.join(os.fspath(ckpt_dir), MASK_EMBEDDING_FILE)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            data = f.read()
    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return parse_mask_embedding(obj, plan)
