"""SentencePiece-vocabulary GGUFs written by llama.cpp's converter, and the ids Hugging Face's
tokenizers (and SentencePiece itself) give for the same text.

Why this exists
---------------
fastdeploy rebuilds a GGUF's tokenizer from its metadata alone (`input/gguf_tokenizer.py`). To
test that against independent code, this tool

* trains two small SentencePiece BPE models with byte fallback on tests/fixtures/perplexity_text.txt
  plus a few lines of code and non-English text: a Llama-style one (`add_dummy_prefix`, ids
  <unk>=0 <s>=1 </s>=2) and a Gemma-style one (no dummy prefix, <pad>=0 <eos>=1 <bos>=2
  <unk>=3, `<start_of_turn>` / `<end_of_turn>` as special added tokens, a chat template);
* puts each beside a tiny checkpoint (the Llama model of tests/models/tiny_checkpoints.py, the
  Gemma 3 model of tests/models/tiny_families.py) with a tokenizer_config.json naming
  `LlamaTokenizer` / `GemmaTokenizer`, and a config.json whose vocabulary is two ids larger
  than the SentencePiece model (the converter pads with unused `[PAD]` pieces, as for real
  models whose embedding is rounded up);
* runs llama.cpp's `convert_hf_to_gguf.py --vocab-only` on each directory, writing
  tests/fixtures/gguf/tiny-{llama,gemma}-spm-vocab.gguf (metadata only, a few kB);
* records, for every text of `TEXTS`, the ids of transformers' `AutoTokenizer` of the directory
  with and without special tokens, its decoding, and SentencePiece's own ids, in
  tests/fixtures/spm_tokenizer_references.json. For text with special tokens inside
  (`SPECIAL_TEXTS`) it records the ids of llama.cpp's rule: each stretch between special tokens
  encoded by SentencePiece on its own (so each gets the dummy prefix), and transformers' ids.

Regenerate (needs transformers, sentencepiece and llama.cpp's sources, whose converter ships in
the llama-cpp-python sdist under vendor/llama.cpp)::

    python tools/make_tokenizer_references.py --llama-cpp path/to/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sentencepiece as spm  # noqa: E402
import transformers  # noqa: E402
from make_family_references import REPO_ROOT, load_test_module  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "spm_tokenizer_references.json"
GGUF_DIR = REPO_ROOT / "tests" / "fixtures" / "gguf"

EXTRA_CORPUS = [
    "def add(a, b):\n    return a + b  # the sum\n",
    "for (int i = 0; i < n; ++i) { total += values[i]; }",
    "Le café est très bon, naïve façade, über straße, año señor.",
    "河流从山上流下来，带着沙子和石头。水很清。",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2026",
]

TEXTS = [
    "Hello world",
    "A river begins as rain.",
    "  two leading spaces and two trailing  ",
    "multiple   spaces    between     words",
    "tabs\tand\nnewlines\n\n\nthen three",
    "mixed\r\nline endings\r",
    "digits 1234567890 and 3.14159, dates 2026-11-28",
    "Ünïcödé: café naïve façade Ærøskøbing",
    "河流的水很清。日本語のテキスト、한국어 텍스트",
    "Кириллица и العربية",
    "Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷 done",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a && b) { return c[i] >= 0; }",
    "\u00a0non-breaking\u2009thin\u3000ideographic space",
    "CamelCaseIdentifiers and snake_case_names",
    "<0x41> looks like a byte piece",
    "      ",
    " ",
    "a",
    "",
]

#: texts with special tokens inside: (llama-style, gemma-style)
SPECIAL_TEXTS = {
    "llama": ["<s>Hello</s> world", "Hi</s>\nthere<s>"],
    "gemma": [
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "text<end_of_turn>more text",
    ],
}

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def train(directory: Path, style: str) -> Path:
    corpus = directory / "corpus.txt"
    text = (REPO_ROOT / "tests" / "fixtures" / "perplexity_text.txt").read_text(encoding="utf-8")
    corpus.write_text(text + "\n" + "\n".join(EXTRA_CORPUS) + "\n", encoding="utf-8")
    prefix = directory / "tokenizer"
    ids = (
        {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}
        if style == "llama"
        else {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3, "bos_piece": "<bos>", "eos_piece": "<eos>"}
    )
    options: dict[str, Any] = {
        "input": str(corpus),
        "model_prefix": str(prefix),
        "vocab_size": 420,
        "model_type": "bpe",
        "character_coverage": 0.995,
        "byte_fallback": True,
        "split_digits": True,
        "allow_whitespace_only_pieces": True,
        "remove_extra_whitespaces": False,
        "normalization_rule_name": "identity",
        "add_dummy_prefix": style == "llama",
        "num_threads": 1,
        "minloglevel": 2,
        **ids,
    }
    if style == "gemma":
        options["user_defined_symbols"] = ["<start_of_turn>", "<end_of_turn>"]
    spm.SentencePieceTrainer.train(**options)
    return prefix.with_suffix(".model")


def write_checkpoint(directory: Path, style: str, model: Path) -> spm.SentencePieceProcessor:
    tiny = load_test_module("tiny_checkpoints")
    families = load_test_module("tiny_families")
    if style == "llama":
        tiny.write_checkpoint(directory, "llama")
    else:
        families.write_checkpoint(directory, "gemma3")
    shutil.copy(model, directory / "tokenizer.model")
    processor = spm.SentencePieceProcessor(model_file=str(model))
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["vocab_size"] = processor.vocab_size() + 2
    if style == "gemma":  # Gemma's order: <pad>=0, <eos>=1, <bos>=2
        config.update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    if style == "llama":
        tokenizer_config: dict[str, Any] = {
            "tokenizer_class": "LlamaTokenizer",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "legacy": False,
        }
    else:
        turn_ids = {token: processor.piece_to_id(token) for token in ("<start_of_turn>", "<end_of_turn>")}
        tokenizer_config = {
            "tokenizer_class": "GemmaTokenizer",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "add_bos_token": True,
            "add_eos_token": False,
            "chat_template": GEMMA_TEMPLATE,
            "added_tokens_decoder": {
                str(token_id): {"content": token, "special": True, "normalized": False}
                for token, token_id in turn_ids.items()
            },
        }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1), encoding="utf-8")
    return processor


def convert(llama_cpp: Path, directory: Path, target: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"), NO_LOCAL_GGUF="")
    command = [
        sys.executable,
        str(llama_cpp / "convert_hf_to_gguf.py"),
        str(directory),
        "--vocab-only",
        "--outfile",
        str(target),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"the converter failed on {directory}:\n{result.stderr}")
    print(f"wrote {target.relative_to(REPO_ROOT)} ({target.stat().st_size} bytes)")


def segment_ids(processor: spm.SentencePieceProcessor, text: str, specials: list[str]) -> list[int]:
    """llama.cpp's rule: special tokens kept whole, each stretch between them encoded alone."""
    pattern = "(" + "|".join(re.escape(token) for token in sorted(specials, key=len, reverse=True)) + ")"
    ids: list[int] = []
    for part in re.split(pattern, text):
        if part in specials:
            ids.append(processor.piece_to_id(part))
        elif part:
            ids.extend(processor.encode(part))
    return ids


def references(directory: Path, style: str, processor: spm.SentencePieceProcessor) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    encodings = []
    for text in TEXTS:
        plain = tokenizer.encode(text, add_special_tokens=False)
        encodings.append(
            {
                "text": text,
                "ids": plain,
                "ids_with_special": tokenizer.encode(text, add_special_tokens=True),
                "sentencepiece_ids": processor.encode(text),
                "decoded": tokenizer.decode(plain),
            }
        )
    specials = ["<s>", "</s>"] if style == "llama" else ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"]
    special_texts = [
        {
            "text": text,
            "ids": segment_ids(processor, text, specials),
            "hf_ids": tokenizer.encode(text, add_special_tokens=False),
        }
        for text in SPECIAL_TEXTS[style]
    ]
    return {
        "tokenizer_class": type(tokenizer).__name__,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "vocab_size": processor.vocab_size(),
        "encodings": encodings,
        "special_texts": special_texts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source directory")
    args = parser.parse_args()
    data: dict[str, Any] = {
        "metadata": {
            "generator": "tools/make_tokenizer_references.py",
            "transformers_version": transformers.__version__,
            "sentencepiece_version": spm.__version__,
            "python_version": platform.python_version(),
        },
        "models": {},
    }
    digests = {}
    with tempfile.TemporaryDirectory() as scratch:
        for style in ("llama", "gemma"):
            directory = Path(scratch) / style
            directory.mkdir()
            train_dir = Path(scratch) / f"{style}-train"
            train_dir.mkdir()
            model = train(train_dir, style)
            processor = write_checkpoint(directory, style, model)
            target = GGUF_DIR / f"tiny-{style}-spm-vocab.gguf"
            convert(args.llama_cpp, directory, target)
            digests[target.name] = hashlib.sha256(target.read_bytes()).hexdigest()
            data["models"][style] = references(directory, style, processor)
    FIXTURE.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE.relative_to(REPO_ROOT)} ({FIXTURE.stat().st_size} bytes)")
    print(json.dumps(digests, indent=1))


if __name__ == "__main__":
    main()
