"""DeepSeek-V3 multi-token prediction: single-stream decoding with and without `"mtp"` drafts.

No DeepSeek-V3 checkpoint fits here, and on random weights an MTP layer's drafts are almost never
right, so the figure comes from a DeepSeek-V3-shaped model (latent attention, grouped-routed
experts, one dense layer, an MTP layer) built so that its drafts are right by construction:

- the main model's attention outputs and feed-forward down projections are zero, so each
  position's final hidden state is its token's (unit-norm, random) embedding, and its head is
  the embedding table permuted: greedy decoding follows a fixed permutation, t_{i+1} = P(t_i);
- the MTP layer's block is zeroed the same way, `eh_proj` passes the next token's embedding
  through, and its head is the main one, so at position i it predicts P(t_{i+1}) = t_{i+2}.

Every matrix keeps its size, so both engines do the full work of the shape; only the values make
acceptance certain. This measures the speculative machinery at 100% acceptance (the ceiling a
trained MTP layer approaches on grounded prompts, where DeepSeek reports 85-90% for the second
token); `--random-mtp` keeps the MTP layer's random weights instead (acceptance near 0: the
worst case, bounded by the back-off). Greedy tokens must be identical with and without MTP.

    python benchmarks/mtp.py [--new-tokens 96] [--k 1 2 3] [--repeats 3] [--random-mtp]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_resolver import embedded_model_path

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "n_shared_experts": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPT = [3 + (97 * i + 5) % 2000 for i in range(64)]


def _swiglu(rng: np.random.Generator, prefix: str, hidden: int, inner: int) -> dict[str, np.ndarray]:
    return {
        prefix + "gate_proj.weight": rng.standard_normal((inner, hidden)) / np.sqrt(hidden),
        prefix + "up_proj.weight": rng.standard_normal((inner, hidden)) / np.sqrt(hidden),
        prefix + "down_proj.weight": np.zeros((hidden, inner)),
    }


def _layer(rng: np.random.Generator, c: dict, index: int) -> dict[str, np.ndarray]:
    """Layer `index` with random projections into attention and experts, zero ones out of them."""
    hidden, heads, p = c["hidden_size"], c["num_attention_heads"], f"model.layers.{index}."
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    lora, q_lora = c["kv_lora_rank"], c["q_lora_rank"]
    out = {
        p + "input_layernorm.weight": np.ones(hidden),
        p + "post_attention_layernorm.weight": np.ones(hidden),
        p + "self_attn.q_a_proj.weight": rng.standard_normal((q_lora, hidden)) / np.sqrt(hidden),
        p + "self_attn.q_a_layernorm.weight": np.ones(q_lora),
        p + "self_attn.q_b_proj.weight": rng.standard_normal((heads * qk, q_lora)) / np.sqrt(q_lora),
        p + "self_attn.kv_a_proj_with_mqa.weight": rng.standard_normal((lora + c["qk_rope_head_dim"], hidden))
        / np.sqrt(hidden),
        p + "self_attn.kv_a_layernorm.weight": np.ones(lora),
        p + "self_attn.kv_b_proj.weight": rng.standard_normal(
            (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), lora)
        )
        / np.sqrt(lora),
        p + "self_attn.o_proj.weight": np.zeros((hidden, heads * c["v_head_dim"])),
    }
    if index < c["first_k_dense_replace"]:
        out.update(_swiglu(rng, p + "mlp.", hidden, c["intermediate_size"]))
        return out
    out[p + "mlp.gate.weight"] = rng.standard_normal((c["n_routed_experts"], hidden)) / np.sqrt(hidden)
    out[p + "mlp.gate.e_score_correction_bias"] = rng.uniform(0, 0.1, c["n_routed_experts"])
    for e in range(c["n_routed_experts"]):
        out.update(_swiglu(rng, f"{p}mlp.experts.{e}.", hidden, c["moe_intermediate_size"]))
    out.update(
        _swiglu(rng, p + "mlp.shared_experts.", hidden, c["moe_intermediate_size"] * c["n_shared_experts"])
    )
    return out


def write_model(directory: Path, random_mtp: bool) -> list[int]:
    """The checkpoint (see the module doc); returns the permutation greedy decoding follows."""
    rng = np.random.default_rng(0)
    c, hidden, vocab = CONFIG, CONFIG["hidden_size"], CONFIG["vocab_size"]
    embed = rng.standard_normal((vocab, hidden))
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    permutation = rng.permutation(vocab)
    head = np.empty_like(embed)
    head[permutation] = embed  # logits[v] peak where v = P(t)
    tensors = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": np.ones(hidden),
        "lm_head.weight": head,
    }
    for index in range(c["num_hidden_layers"] + 1):
        tensors.update(_layer(rng, c, index))
    m = f"model.layers.{c['num_hidden_layers']}."
    tensors.update(
        {
            m + "enorm.weight": np.ones(hidden),
            m + "hnorm.weight": np.ones(hidden),
            m + "eh_proj.weight": np.concatenate([np.eye(hidden), np.zeros((hidden, hidden))], axis=1),
            m + "shared_head.norm.weight": np.ones(hidden),
            m + "shared_head.head.weight": head,
            m + "embed_tokens.weight": embed,
        }
    )
    if random_mtp:
        for name in [n for n in tensors if n.startswith(m) and n.endswith("proj.weight")]:
            tensors[name] = rng.standard_normal(tensors[name].shape) / np.sqrt(tensors[name].shape[1])
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
        str(directory / "model.safetensors"),
    )
    (directory / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    return permutation.tolist()


def timed(llm: LLM, new_tokens: int) -> tuple[float, list[int], object]:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    (output,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    return time.perf_counter() - start, output.outputs.token_ids, output.metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-mtp", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        permutation = write_model(directory, args.random_mtp)
        common = {
            "model": str(directory),
            "tokenizer": embedded_model_path(),
            "max_model_len": 512,
            "max_num_seqs": 1,
        }
        engines = {0: LLM(**common)}
        for k in args.k:
            engines[k] = LLM(**common, speculative_config={"method": "mtp", "num_speculative_tokens": k})
        for llm in engines.values():
            timed(llm, 4)  # warm up
        best = {k: float("inf") for k in engines}
        tokens, metrics = {}, {}
        for _ in range(args.repeats):
            for k, llm in engines.items():
                seconds, tokens[k], metrics[k] = timed(llm, args.new_tokens)
                best[k] = min(best[k], seconds)
        expected = [permutation[PROMPT[-1]]]
        while len(expected) < args.new_tokens:
            expected.append(permutation[expected[-1]])
        assert tokens[0] == expected, "the main model does not follow its permutation"
        mode = "random MTP weights" if args.random_mtp else "MTP right by construction"
        print(
            f"DeepSeek-V3 shape {CONFIG['num_hidden_layers']} layers, hidden {CONFIG['hidden_size']}; {mode}"
        )
        print(f"{'k':>3} {'tok/s':>8} {'ratio':>6} {'accepted':>9} {'per step':>9} {'same tokens':>12}")
        for k in engines:
            rate = getattr(metrics[k], "spec_acceptance_rate", None)
            per_step = getattr(metrics[k], "spec_accepted_tokens_per_step", None)
            print(
                f"{k:>3} {args.new_tokens / best[k]:>8.1f} {best[0] / best[k]:>5.2f}x "
                f"{'-' if rate is None else f'{rate:.2f}':>9} {'-' if per_step is None else f'{per_step:.2f}':>9} "
                f"{str(tokens[k] == tokens[0]):>12}"
            )


if __name__ == "__main__":
    main()
