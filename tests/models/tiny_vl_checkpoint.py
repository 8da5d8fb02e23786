"""A tiny random-weight ERNIE-4.5-VL checkpoint (`Ernie4_5_VLMoeForConditionalGeneration`), rebuilt
from a seed, in the `-PT` layout (the tensor names and shapes of the published -PT checkpoints,
which transformers reads) and in the `-Paddle` layout (FastDeploy's).

Shared by the tests and by tools/make_vl_references.py, which loads exactly these weights into
transformers to write tests/fixtures/ernie4_5_vl_references.json. Only numpy and safetensors.

-PT layout (as transformers 5.23 saves it; the hub files also put the vision tower at the root
as `vision_model.`, which the loader accepts too):
- text model under `model.`: embeddings, norm, attention q/k/v/o [out, in]; layer 0 a dense
  SwiGLU MLP; MoE layers with `mlp.experts.0..2E-1` (the first E text experts, then E vision
  experts of their own width), routers `mlp.gate.weight` (text) and `mlp.gate.weight_1`
  (vision) stored [hidden, E], `mlp.moe_statics.e_score_correction_bias` [2, E], and
  `mlp.shared_experts`;
- `model.vision_model.`: `patch_embed.proj` (no bias), blocks with norm1/norm2 (LayerNorm),
  `attn.qkv`, `attn.proj`, `mlp.fc1`, `mlp.fc2`, and the final `ln`;
- `model.resampler_model.`: `spatial_linear.{0,2,3}`, `temporal_linear.{0,2,3}` (fc1, fc2,
  LayerNorm), `mlp`, `after_norm` (RMSNorm).
-Paddle layout: `ernie.` instead of `model.` for the text model and resampler, `vision_model.` at
the root, fused `qkv_proj` and `up_gate_proj`, every 2-D linear weight [in, out].
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from tiny_checkpoints import write_safetensors

SEED = 4545
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: mm_processor_kwargs of the reference cases' video (tools/make_vl_references.py's bounds)
VIDEO_KWARGS = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 8}
IMAGE_START, IMAGE_END, IMAGE_TOKEN = 150, 151, 152
VIDEO_START, VIDEO_END, VIDEO_TOKEN = 153, 154, 155

CONFIG: dict[str, Any] = {
    "architectures": ["Ernie4_5_VLMoeForConditionalGeneration"],
    "model_type": "ernie4_5_vl_moe",
    "torch_dtype": "float32",
    "tie_word_embeddings": True,
    "image_start_token_id": IMAGE_START,
    "image_end_token_id": IMAGE_END,
    "image_token_id": IMAGE_TOKEN,
    "video_start_token_id": VIDEO_START,
    "video_end_token_id": VIDEO_END,
    "video_token_id": VIDEO_TOKEN,
    "text_config": {
        "model_type": "ernie4_5_vl_moe_text",
        "vocab_size": 160,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-05,
        "use_bias": False,
        "tie_word_embeddings": True,
        "moe_intermediate_size": [16, 8],
        "moe_k": 2,
        "moe_num_experts": 4,
        "moe_num_shared_experts": 1,
        "moe_norm_min": 1e-12,
        "mlp_layer_types": ["dense", "sparse", "sparse"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [3, 3, 2]},
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    },
    "vision_config": {
        "model_type": "ernie4_5_vl_moe_vision",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "hidden_act": "quick_gelu",
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_merge_size": 2,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
    },
}


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the -PT checkpoint with its on-disk shape."""
    text, vision = config["text_config"], config["vision_config"]
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    heads, kv_heads, head_dim = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (vocab, hidden)
    experts = text["moe_num_experts"]
    text_inner, vision_inner = text["moe_intermediate_size"]
    for i, kind in enumerate(text["mlp_layer_types"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for name, size in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (size, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        mlp = p + "mlp."
        if kind == "dense":
            shapes.update(_swiglu(mlp, hidden, text["intermediate_size"]))
            continue
        shapes[mlp + "gate.weight"] = (hidden, experts)
        shapes[mlp + "gate.weight_1"] = (hidden, experts)
        shapes[mlp + "moe_statics.e_score_correction_bias"] = (2, experts)
        for e in range(2 * experts):
            shapes.update(_swiglu(f"{mlp}experts.{e}.", hidden, text_inner if e < experts else vision_inner))
        if text["moe_num_shared_experts"]:
            shapes.update(
                _swiglu(mlp + "shared_experts.", hidden, text_inner * text["moe_num_shared_experts"])
            )
    v_hidden, v_inner = vision["hidden_size"], vision["intermediate_size"]
    patch = vision["in_channels"] * vision["patch_size"] ** 2
    v = "model.vision_model."
    shapes[v + "patch_embed.proj.weight"] = (v_hidden, patch)
    for i in range(vision["depth"]):
        b = f"{v}blocks.{i}."
        for norm in ("norm1", "norm2"):
            shapes[f"{b}{norm}.weight"] = (v_hidden,)
            shapes[f"{b}{norm}.bias"] = (v_hidden,)
        for name, out_dim, in_dim in (
            ("attn.qkv", 3 * v_hidden, v_hidden),
            ("attn.proj", v_hidden, v_hidden),
            ("mlp.fc1", v_inner, v_hidden),
            ("mlp.fc2", v_hidden, v_inner),
        ):
            shapes[f"{b}{name}.weight"] = (out_dim, in_dim)
            shapes[f"{b}{name}.bias"] = (out_dim,)
    shapes[v + "ln.weight"] = (v_hidden,)
    shapes[v + "ln.bias"] = (v_hidden,)
    merged = v_hidden * vision["spatial_merge_size"] ** 2
    r = "model.resampler_model."
    for name, in_dim in (
        ("spatial_linear", merged),
        ("temporal_linear", merged * vision["temporal_merge_size"]),
    ):
        shapes[f"{r}{name}.0.weight"] = (merged, in_dim)
        shapes[f"{r}{name}.0.bias"] = (merged,)
        shapes[f"{r}{name}.2.weight"] = (merged, merged)
        shapes[f"{r}{name}.2.bias"] = (merged,)
        shapes[f"{r}{name}.3.weight"] = (merged,)
        shapes[f"{r}{name}.3.bias"] = (merged,)
    shapes[r + "mlp.weight"] = (hidden, merged)
    shapes[r + "mlp.bias"] = (hidden,)
    shapes[r + "after_norm.weight"] = (hidden,)
    return shapes


def _swiglu(prefix: str, hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (inner, hidden),
        prefix + "up_proj.weight": (inner, hidden),
        prefix + "down_proj.weight": (hidden, inner),
    }


def pt_tensors(config: dict[str, Any] | None = None, seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded float32 weights in the -PT layout; scales keep logits spread (no near-ties)."""
    config = config or CONFIG
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in sorted(tensor_shapes(config).items()):
        if name.endswith("e_score_correction_bias"):
            value = rng.uniform(0.0, 0.15, size=shape)
        elif name.endswith(
            ("norm.weight", "layernorm.weight", "norm1.weight", "norm2.weight", "ln.weight")
        ) or (name.endswith(".3.weight")):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            value = 0.4 * rng.standard_normal(shape)
        elif ".mlp.gate.weight" in name:  # routers are stored [hidden, experts]
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[-1])
        tensors[name] = value.astype(np.float32)
    return tensors


def paddle_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same weights as a -Paddle checkpoint stores them."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if name.startswith("model.vision_model."):
            paddle_name = name[len("model.") :]
        elif name.startswith("model."):
            paddle_name = "ernie." + name[len("model.") :]
        else:
            paddle_name = name
        base, _, kind = paddle_name.rpartition(".")
        if base.endswith(("self_attn.k_proj", "self_attn.v_proj", "up_proj")):
            continue
        if base.endswith("self_attn.q_proj"):
            stem = name[: -len(f"q_proj.{kind}")]
            fused = np.concatenate([tensors[f"{stem}{p}_proj.{kind}"] for p in "qkv"], axis=0)
            out[base[: -len("q_proj")] + f"qkv_proj.{kind}"] = fused.T.copy()
        elif base.endswith("gate_proj"):
            stem = name[: -len(f"gate_proj.{kind}")]
            fused = np.concatenate(
                [tensors[f"{stem}gate_proj.{kind}"], tensors[f"{stem}up_proj.{kind}"]], axis=0
            )
            out[base[: -len("gate_proj")] + f"up_gate_proj.{kind}"] = fused.T.copy()
        elif (
            kind != "weight"
            or value.ndim != 2
            or ".mlp.gate." in name
            or name.endswith("embed_tokens.weight")
        ):
            out[paddle_name] = value  # routers are [in, out] in both layouts; embeddings [vocab, hidden]
        else:
            out[paddle_name] = value.T.copy()
    return out


def paddle_config(config: dict[str, Any]) -> dict[str, Any]:
    """A flat config.json as the -Paddle checkpoints have it (text fields at the top level)."""
    text = dict(config["text_config"])
    section = text.pop("rope_parameters")
    flat = {k: v for k, v in config.items() if k != "text_config"}
    flat.update({k: v for k, v in text.items() if k != "mlp_layer_types"})
    flat["rope_theta"] = section["rope_theta"]
    flat["freq_allocation"] = section["mrope_section"][2]
    flat["moe_num_experts"] = [text["moe_num_experts"]] * 2
    first_moe = text["mlp_layer_types"].index("sparse")
    flat["moe_layer_start_index"] = [first_moe, first_moe]
    flat["moe_layer_end_index"] = [text["num_hidden_layers"] - 1] * 2
    flat["moe_layer_interval"] = 1
    flat["im_patch_id"] = config["image_token_id"]
    flat["model_type"] = "ernie4_5_moe_vl"
    return flat


def write_checkpoint(
    directory: str | os.PathLike[str], layout: str = "pt", config: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Write the tiny VL model as a -PT ("pt") or -Paddle ("paddle") directory; returns PT tensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = config or CONFIG
    tensors = pt_tensors(config)
    if layout == "pt":
        write_safetensors(directory, tensors)
        on_disk = config
    elif layout == "paddle":
        write_safetensors(directory, paddle_tensors(tensors))
        on_disk = paddle_config(config)
    else:
        raise ValueError(f"layout must be 'pt' or 'paddle', got {layout!r}")
    (directory / "config.json").write_text(json.dumps(on_disk, indent=1), encoding="utf-8")
    return tensors


#: ERNIE-4.5-VL's vision tokens, added after the tiny tokenizer's ERNIE tokens (ids 32010-32015)
VL_ADDED_TOKENS = [
    "<|IMAGE_START|>",
    "<|IMAGE_END|>",
    "<|IMAGE_PLACEHOLDER|>",
    "<|VIDEO_START|>",
    "<|VIDEO_END|>",
    "<|VIDEO_PLACEHOLDER|>",
]
#: a config whose vocabulary covers the tokenizer, for chat tests (other weights than CONFIG's)
CHAT_CONFIG = {
    **CONFIG,
    "text_config": {**CONFIG["text_config"], "vocab_size": 32016},
    "image_start_token_id": 32010,
    "image_end_token_id": 32011,
    "image_token_id": 32012,
    "video_start_token_id": 32013,
    "video_end_token_id": 32014,
    "video_token_id": 32015,
}


def write_vl_tokenizer(directory: str | os.PathLike[str], chat_template: str | None = None) -> None:
    """The tiny ERNIE tokenizer plus the vision tokens (and a chat template, if given)."""
    from tiny_checkpoints import FIRST_ADDED_ID, write_ernie_tokenizer

    write_ernie_tokenizer(directory, chat_template)
    path = Path(directory) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    first = FIRST_ADDED_ID + len(config["added_tokens_decoder"])
    for offset, text in enumerate(VL_ADDED_TOKENS):
        config["added_tokens_decoder"][str(first + offset)] = {
            "content": text,
            "special": True,
            "normalized": False,
        }
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")


def load_references() -> dict[str, Any]:
    """transformers' outputs for the reference cases (tests/fixtures/ernie4_5_vl_references.json)."""
    return json.loads((FIXTURES / "ernie4_5_vl_references.json").read_text(encoding="utf-8"))


def case_media(case: dict[str, Any]) -> dict[str, list]:
    """A reference case's `multimodal_data`: its photographs, and its video as frames cut from one."""
    from PIL import Image

    images = FIXTURES / "images"
    data: dict[str, list] = {}
    if case.get("images"):
        data["image"] = [Image.open(images / name) for name in case["images"]]
    if case.get("video"):
        spec = case["video"]
        photo = np.asarray(Image.open(images / spec["source"]).convert("RGB"))
        width, height = spec["size"]
        step = spec["step"]
        data["video"] = [
            [photo[10 : 10 + height, i * step : i * step + width] for i in range(spec["frames"])]
        ]
    return data


def case_prompt(case: dict[str, Any]) -> dict[str, Any]:
    """A reference case as an `LLM.generate` prompt."""
    prompt: dict[str, Any] = {"prompt_token_ids": case["prompt_token_ids"]}
    if case_media(case):
        prompt["multimodal_data"] = case_media(case)
    return prompt
