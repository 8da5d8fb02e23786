"""SentencePiece-style GGUF vocabularies (`tokenizer.ggml.model == "llama"`) against Hugging Face.

The two GGUFs are llama.cpp's converter's output (`--vocab-only`) for a Llama-style and a
Gemma-style SentencePiece model with byte fallback; the ids are transformers' `AutoTokenizer`
of the same directories and SentencePiece's own (tools/make_tokenizer_references.py).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.formats.gguf_file import read_gguf_metadata
from fastdeploy.input.family_templates import FAMILY_CHAT_TEMPLATES
from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader, build_gguf_tokenizer
from fastdeploy.input.hf_tokenizer import HFTokenizer
from fastdeploy.plugins.registry import get_registry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STYLES = ("llama", "gemma")
TEXTS_STARTING_WITH_SPACE = ["  two leading spaces and two trailing  ", "      ", " "]


@pytest.fixture(scope="module")
def references() -> dict[str, Any]:
    return json.loads((FIXTURES / "spm_tokenizer_references.json").read_text(encoding="utf-8"))["models"]


def gguf_path(style: str) -> str:
    return str(FIXTURES / "gguf" / f"tiny-{style}-spm-vocab.gguf")


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, HFTokenizer]:
    return {style: GGUFTokenizerLoader().load(gguf_path(style)) for style in STYLES}


@pytest.mark.parametrize("style", STYLES)
def test_ids_equal_hugging_face_and_sentencepiece(style, tokenizers, references) -> None:
    """Every text gives SentencePiece's ids (what llama.cpp computes) and, but for one case,
    transformers' ids; decoding gives the text back."""
    tokenizer, bos = tokenizers[style], references[style]["bos_token_id"]
    differing = []
    for entry in references[style]["encodings"]:
        text, expected = entry["text"], entry["sentencepiece_ids"]
        assert tokenizer.encode(text, add_special_tokens=False) == expected, repr(text)
        assert tokenizer.encode(text, add_special_tokens=True) == [bos, *expected], repr(text)
        assert tokenizer.decode(expected) == text, repr(text)
        if entry["ids"] == expected:
            assert entry["ids_with_special"] == [bos, *expected]
            assert entry["decoded"] == text
        else:
            differing.append(text)
            # transformers 5's LlamaTokenizer adds no "▁" prefix to text that starts with a
            # space; SentencePiece and llama.cpp always do (add_dummy_prefix)
            space = tokenizer.token_to_id("\u2581")
            assert text.startswith(" ") and expected == [space, *entry["ids"]], repr(text)
    assert differing == ([] if style == "gemma" else [t for t in TEXTS_STARTING_WITH_SPACE])


@pytest.mark.parametrize("style", STYLES)
def test_characters_outside_the_vocabulary_fall_back_to_bytes(style, tokenizers) -> None:
    tokenizer = tokenizers[style]
    ids = tokenizer.encode("👨‍👩‍👧", add_special_tokens=False)
    pieces = [tokenizer.id_to_token(token_id) for token_id in ids]
    byte_pieces = [piece for piece in pieces if piece.startswith("<0x")]
    # the family emoji is 18 UTF-8 bytes, none of them a piece of this small vocabulary
    assert len(byte_pieces) == 18
    assert bytes(int(piece[3:5], 16) for piece in byte_pieces) == "👨‍👩‍👧".encode()
    assert tokenizer.decode(ids) == "👨‍👩‍👧"


@pytest.mark.parametrize("style", STYLES)
def test_special_tokens_split_the_text_as_llama_cpp_does(style, tokenizers, references) -> None:
    """Each stretch between special tokens is tokenized on its own (and, for Llama, gets its
    own leading "▁"), as llama.cpp does and SentencePiece per segment gives. transformers
    agrees for Gemma; its Llama tokenizer prefixes only the start of the whole text."""
    for entry in references[style]["special_texts"]:
        assert tokenizers[style].encode(entry["text"], add_special_tokens=False) == entry["ids"], entry[
            "text"
        ]
        assert (entry["ids"] == entry["hf_ids"]) is (style == "gemma")


def test_gemma_style_file_metadata(tokenizers, references) -> None:
    tokenizer, reference = tokenizers["gemma"], references["gemma"]
    metadata = read_gguf_metadata(gguf_path("gemma"))
    assert metadata["tokenizer.ggml.model"] == "llama"
    assert metadata["tokenizer.ggml.add_space_prefix"] is False
    assert tokenizer.bos_token_id == reference["bos_token_id"] == 2
    assert tokenizer.eos_token_id == reference["eos_token_id"] == 1
    assert tokenizer.add_bos_token
    end_of_turn = tokenizer.token_to_id("<end_of_turn>")
    assert end_of_turn is not None and tokenizer.eos_token_ids == frozenset({1, end_of_turn})
    assert {end_of_turn, tokenizer.token_to_id("<start_of_turn>")} <= tokenizer.special_token_ids
    # the converter pads the vocabulary to config.json's size with unused pieces
    assert tokenizer.vocab_size == reference["vocab_size"] + 2
    assert tokenizer.id_to_token(tokenizer.vocab_size - 1) == "[PAD{}]".format(reference["vocab_size"] + 1)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": " Hi there "}], tokenize=True)
    expected = [tokenizer.bos_token_id] + references["gemma"]["special_texts"][0]["ids"]
    assert prompt == expected


def test_llama_style_file_metadata(tokenizers, references) -> None:
    tokenizer, reference = tokenizers["llama"], references["llama"]
    assert tokenizer.bos_token_id == reference["bos_token_id"] == 1
    assert tokenizer.eos_token_ids == frozenset({reference["eos_token_id"]}) == frozenset({2})
    assert tokenizer.add_bos_token and not tokenizer.add_eos_token
    assert tokenizer.chat_template is None
    assert (
        tokenizer.decode([1, *tokenizer.encode("Hello world", add_special_tokens=False), 2]) == "Hello world"
    )


def test_add_eos_and_add_bos_flags(references) -> None:
    metadata = dict(read_gguf_metadata(gguf_path("llama")))
    metadata["tokenizer.ggml.add_eos_token"] = True
    metadata["tokenizer.ggml.add_bos_token"] = False
    tokenizer = build_gguf_tokenizer(metadata)
    hello = references["llama"]["encodings"][0]
    assert tokenizer.encode(hello["text"]) == [*hello["ids"], 2]


def test_phi3_special_tokens_swallow_the_whitespace_after_them(references) -> None:
    """llama.cpp (and Phi-3's tokenizer.json) strip whitespace after Phi-3's special tokens but
    not after <s>; the stretch after them still gets its leading "▁"."""
    metadata = dict(read_gguf_metadata(gguf_path("llama")))
    hello = references["llama"]["encodings"][0]
    assert hello["text"] == "Hello world"
    plain = build_gguf_tokenizer(metadata)
    metadata["general.name"] = "Phi-3 Mini 4k Instruct"
    phi3 = build_gguf_tokenizer(metadata)
    text = "</s> \n  Hello world"
    assert phi3.encode(text, add_special_tokens=False) == [2, *hello["sentencepiece_ids"]]
    assert plain.encode(text, add_special_tokens=False) != [2, *hello["sentencepiece_ids"]]
    assert phi3.encode("<s>Hello world", add_special_tokens=False) == [1, *hello["sentencepiece_ids"]]
    assert phi3.encode("<s> Hello world", add_special_tokens=False) == plain.encode(
        "<s> Hello world", add_special_tokens=False
    )


def test_a_missing_score_list_is_named() -> None:
    metadata = dict(read_gguf_metadata(gguf_path("llama")))
    del metadata["tokenizer.ggml.scores"]
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.scores is missing"):
        build_gguf_tokenizer(metadata, source="x.gguf")
    metadata["tokenizer.ggml.scores"] = [0.0, 1.0]
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.scores has 2 entries"):
        build_gguf_tokenizer(metadata, source="x.gguf")
    metadata["tokenizer.ggml.scores"] = ["high"] * len(metadata["tokenizer.ggml.tokens"])
    with pytest.raises(UnsupportedModelError, match="x.gguf: tokenizer.ggml.scores must be numbers"):
        build_gguf_tokenizer(metadata, source="x.gguf")


def test_an_unknown_tokenizer_model_is_named() -> None:
    metadata = dict(read_gguf_metadata(gguf_path("llama")))
    metadata["tokenizer.ggml.model"] = "bert"
    with pytest.raises(UnsupportedModelError, match="x.gguf: tokenizer.ggml.model 'bert'.*'gpt2'.*'llama'"):
        build_gguf_tokenizer(metadata, source="x.gguf")


def _gemma_sized_vocabulary() -> dict[str, Any]:
    """Metadata of a 262,144-piece vocabulary the size of Gemma 3's: the Gemma-style file's
    pieces, then every string of 1-4 letters and "▁" over 23 characters (each of which splits
    into pieces in up to 3 ways, ~0.8M merges)."""
    metadata = dict(read_gguf_metadata(gguf_path("gemma")))
    tokens = list(metadata["tokenizer.ggml.tokens"])
    known = set(tokens)
    alphabet = "▁abcdefghijklmnopqrstuv"
    words = ("".join(chars) for length in range(1, 5) for chars in itertools.product(alphabet, repeat=length))
    extra = itertools.islice((word for word in words if word not in known), 262_144 - len(tokens))
    tokens += extra
    metadata["tokenizer.ggml.tokens"] = tokens
    count = len(tokens) - len(metadata["tokenizer.ggml.scores"])
    metadata["tokenizer.ggml.scores"] = [
        *metadata["tokenizer.ggml.scores"],
        *(-1000.0 - i for i in range(count)),
    ]
    metadata["tokenizer.ggml.token_type"] = [*metadata["tokenizer.ggml.token_type"], *[1] * count]
    return metadata


def test_a_gemma_sized_vocabulary_builds_in_seconds() -> None:
    metadata = _gemma_sized_vocabulary()
    assert len(metadata["tokenizer.ggml.tokens"]) == 262_144
    # CPU time, not wall time: the machine may be shared (about 2 s of CPU here)
    start = time.process_time()
    tokenizer = build_gguf_tokenizer(metadata)
    elapsed = time.process_time() - start
    assert elapsed < 10.0, f"building a 262k-piece tokenizer took {elapsed:.1f} s of CPU"
    assert tokenizer.vocab_size == 262_144
    # "abcd" is a piece, and so are its halves: the best-scored one wins, and the text round-trips
    ids = tokenizer.encode("abcd abcdabcd", add_special_tokens=False)
    assert tokenizer.decode(ids) == "abcd abcdabcd"
    assert ids[0] == tokenizer.token_to_id("abcd")


def test_family_templates_are_the_fallback_for_gemma_and_qwen() -> None:
    templates = get_registry().chat_templates()
    for architecture, template in FAMILY_CHAT_TEMPLATES.items():
        assert templates[architecture] == template


def test_gemma_family_template(tokenizers) -> None:
    tokenizer = tokenizers["gemma"]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(messages, chat_template=FAMILY_CHAT_TEMPLATES["Gemma3ForCausalLM"])
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_chatml_family_template(tokenizers) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizers["llama"].apply_chat_template(
        messages, chat_template=FAMILY_CHAT_TEMPLATES["Qwen2ForCausalLM"], add_generation_prompt=True
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
