"""Making LoRA adapters with `peft` and the reference tokens of transformers + peft.

Adapters get random A and B (PEFT initialises B to zero, which would change nothing) scaled so
that each adapter changes the tiny model's greedy tokens; the tests check it does.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the LoRA references need torch (the test extra installs it)")
transformers = pytest.importorskip("transformers", reason="the LoRA references need transformers")
peft = pytest.importorskip("peft", reason="the LoRA tests make their adapters with peft (the test extra)")

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

#: name -> how its adapter is made: ranks, alphas and targets differ between them
ADAPTERS: dict[str, dict[str, Any]] = {
    "all-r8": {"seed": 11, "rank": 8, "alpha": 16, "targets": ALL_TARGETS},
    "attn-r4": {"seed": 12, "rank": 4, "alpha": 4, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "mlp-r2-rslora": {
        "seed": 13,
        "rank": 2,
        "alpha": 3,
        "targets": ["gate_proj", "up_proj", "down_proj"],
        "rslora": True,
    },
}

#: token-id prompts (the tiny vocabulary has 160 tokens)
PROMPTS = [[1, 17, 42, 99, 5, 63, 120], [3, 8, 150, 77, 21, 9, 44, 130, 11, 2, 60]]
NEW_TOKENS = 24


def make_peft_adapter(
    base_dir: str, out_dir: str, seed: int, rank: int, alpha: float, targets: list[str], rslora: bool = False
) -> str:
    """A PEFT LoRA adapter for the checkpoint in `base_dir`, saved by peft in `out_dir`."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=rslora
    )
    adapted = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_A" in name:
                parameter.copy_(torch.randn_like(parameter) / math.sqrt(parameter.shape[1]))
            elif "lora_B" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.6 / math.sqrt(parameter.shape[1]))
    adapted.save_pretrained(out_dir)
    return out_dir


def peft_greedy(base_dir: str, adapter_dir: str | None, prompts: list[list[int]]) -> list[list[int]]:
    """NEW_TOKENS greedy tokens per prompt from transformers (+ peft's adapter), full forward
    passes without a cache."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
            outputs.append(ids[len(prompt) :])
    return outputs
