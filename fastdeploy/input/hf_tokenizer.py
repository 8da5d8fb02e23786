"""A `Tokenizer` over a `tokenizers.Tokenizer`, and the loader for Hugging Face tokenizer directories.

`HFTokenizer` is the one concrete tokenizer for everything the `tokenizers` library can run: a
checkpoint directory's `tokenizer.json`, and the byte-level BPE and SentencePiece vocabularies
that `gguf_tokenizer` rebuilds from GGUF metadata. It adds what `tokenizers` leaves to transformers: which ids end generation,
whether BOS is prepended, and the chat template.

`HFTokenizerLoader` reads a directory the way transformers does: `tokenizer.json`, then
`tokenizer_config.json` (special tokens, `add_bos_token`, chat template, added tokens), with
`special_tokens_map.json` overriding the special tokens and `chat_template.jinja` overriding the
template; `generation_config.json` and `config.json` add end-of-generation ids (instruct models
often end turns with a token other than the tokenizer's EOS, e.g. Llama 3's `<|eot_id|>`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer

from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError
from fastdeploy.input.tokenizer import Tokenizer, TokenizerLoader, require_text
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: special-token names transformers hands to chat templates.
TEMPLATE_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class HFTokenizer(Tokenizer):
    """Wraps a `tokenizers.Tokenizer`; BOS is prepended here, never by its post-processor.

    Encoding always runs the library with `add_special_tokens=False` and then prepends
    `bos_token_id` when `add_special_tokens` and `add_bos_token` are set (and appends
    `eos_token_id` when `add_eos_token` is, as GGUF files may ask), so a tokenizer.json
    post-processor and a GGUF `add_bos_token` flag behave the same; loaders work out
    `add_bos_token` from their files.
    """

    def __init__(
        self,
        tokenizer: RustTokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        unk_token_id: int | None = None,
        pad_token_id: int | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        named_chat_templates: Mapping[str, str] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = (
            vocab_size if vocab_size is not None else tokenizer.get_vocab_size(with_added_tokens=True)
        )
        self.bos_token_id = self._checked_id(bos_token_id, "bos_token_id")
        self.eos_token_id = self._checked_id(eos_token_id, "eos_token_id")
        self.unk_token_id = self._checked_id(unk_token_id, "unk_token_id")
        self.pad_token_id = self._checked_id(pad_token_id, "pad_token_id")
        end_ids = {self._checked_id(token_id, "extra_eos_token_ids") for token_id in extra_eos_token_ids}
        if self.eos_token_id is not None:
            end_ids.add(self.eos_token_id)
        self.eos_token_ids = frozenset(end_ids)
        if add_bos_token and self.bos_token_id is None:
            raise InvalidArgumentError(
                "add_bos_token=True needs a bos_token_id; the tokenizer files name no BOS"
            )
        self.add_bos_token = add_bos_token
        if add_eos_token and self.eos_token_id is None:
            raise InvalidArgumentError(
                "add_eos_token=True needs an eos_token_id; the tokenizer files name no EOS"
            )
        self.add_eos_token = add_eos_token
        self.special_token_ids = frozenset(
            token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        self.chat_template = chat_template
        self.named_chat_templates = dict(named_chat_templates or {})

    def _checked_id(self, token_id: int | None, name: str) -> int | None:
        if token_id is None:
            return None
        if (
            isinstance(token_id, bool)
            or not isinstance(token_id, int)
            or not 0 <= token_id < self._vocab_size
        ):
            raise InvalidArgumentError(
                f"{name}={token_id!r} is not a token id (vocabulary size {self._vocab_size})"
            )
        return token_id

    @property
    def backend(self) -> RustTokenizer:
        """The wrapped `tokenizers.Tokenizer` (e.g. to save it as tokenizer.json)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        require_text(text)
        # encode_batch releases the GIL while it works (encode does not), so the server's event
        # loop keeps answering while a long prompt is tokenized on another thread
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        ids = encoding.ids
        if add_special_tokens and self.add_bos_token:
            ids.insert(0, self.bos_token_id)
        if add_special_tokens and self.add_eos_token:
            ids.append(self.eos_token_id)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(
            [int(token_id) for token_id in token_ids], skip_special_tokens=skip_special_tokens
        )

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._vocab_size:
            return None
        return self._tokenizer.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary piece or added token, or None."""
        return self._tokenizer.token_to_id(token)

    def template_special_tokens(self) -> dict[str, str]:
        ids = (self.bos_token_id, self.eos_token_id, self.unk_token_id, self.pad_token_id)
        return {
            name: self._tokenizer.decode([token_id], skip_special_tokens=False)
            for name, token_id in zip(TEMPLATE_TOKEN_NAMES, ids, strict=True)
            if token_id is not None
        }

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(vocab_size={self._vocab_size}, bos={self.bos_token_id}, "
            f"eos={sorted(self.eos_token_ids)}, add_bos={self.add_bos_token})"
        )


class HFTokenizerLoader(TokenizerLoader):
    """Loads a checkpoint directory that has a `tokenizer.json`."""

    name = "hf-tokenizer-json"
    priority = 0
    reads = "a directory with tokenizer.json (and tokenizer_config.json)"

    def can_load(self, model_path: str) -> bool:
        return os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, "tokenizer.json"))

    def load(self, model_path: str) -> HFTokenizer:
        tokenizer_file = os.path.join(model_path, "tokenizer.json")
        try:
            backend = RustTokenizer.from_file(tokenizer_file)
        except Exception as exc:  # the library raises a bare Exception for malformed files
            raise UnsupportedModelError(
                f"{tokenizer_file} cannot be read by the tokenizers library: {exc}"
            ) from exc
        config = _read_json(model_path, "tokenizer_config.json")
        _add_config_tokens(backend, config.get("added_tokens_decoder"), model_path)
        tokens = {name: _token_content(config.get(name)) for name in TEMPLATE_TOKEN_NAMES}
        for name, value in _read_json(model_path, "special_tokens_map.json").items():
            if name in tokens and _token_content(value) is not None:
                tokens[name] = _token_content(value)
        ids = {name: _lookup(backend, token, name, model_path) for name, token in tokens.items()}

        end_ids = _config_eos_ids(model_path, backend.get_vocab_size(with_added_tokens=True))
        if ids["eos_token"] is None and end_ids:
            ids["eos_token"] = end_ids[0]
        if ids["eos_token"] is None:
            logger.warning(
                "%s names no EOS token; generation stops only at max_tokens or stop strings", model_path
            )

        prefix = _post_processor_prefix(backend)
        add_bos = config.get("add_bos_token")
        if not isinstance(add_bos, bool):
            add_bos = bool(prefix)
        if ids["bos_token"] is None and prefix:
            ids["bos_token"] = prefix[0]
        if add_bos and ids["bos_token"] is None:
            logger.warning("%s sets add_bos_token but names no BOS token; not adding one", model_path)
            add_bos = False

        template, named = _chat_templates(model_path, config)
        tokenizer = HFTokenizer(
            backend,
            bos_token_id=ids["bos_token"],
            eos_token_id=ids["eos_token"],
            unk_token_id=ids["unk_token"],
            pad_token_id=ids["pad_token"],
            extra_eos_token_ids=end_ids,
            add_bos_token=add_bos,
            chat_template=template,
            named_chat_templates=named,
        )
        tokenizer.suffix_token_ids = tuple(_post_processor_suffix(backend))
        logger.info("loaded tokenizer.json from %s: %r", model_path, tokenizer)
        return tokenizer


def _read_json(directory: str, name: str) -> dict[str, Any]:
    """A JSON object file of the checkpoint, or {} if absent; malformed files are errors."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string, or an AddedToken dict with "content"."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _lookup(backend: RustTokenizer, token: str | None, name: str, model_path: str) -> int | None:
    if token is None:
        return None
    token_id = backend.token_to_id(token)
    if token_id is None:
        logger.warning("%s: %s %r is not in the vocabulary; ignoring it", model_path, name, token)
    return token_id


def _add_config_tokens(backend: RustTokenizer, decoder: Any, model_path: str) -> None:
    """Add tokens that tokenizer_config's `added_tokens_decoder` lists but tokenizer.json lacks."""
    if not isinstance(decoder, dict):
        return
    for key, entry in sorted(
        decoder.items(), key=lambda item: int(item[0]) if str(item[0]).isdigit() else -1
    ):
        content = _token_content(entry)
        if content is None or backend.token_to_id(content) is not None:
            continue
        flags = entry if isinstance(entry, dict) else {}
        token = AddedToken(
            content,
            single_word=bool(flags.get("single_word", False)),
            lstrip=bool(flags.get("lstrip", False)),
            rstrip=bool(flags.get("rstrip", False)),
            normalized=bool(flags.get("normalized", False)),
            special=bool(flags.get("special", False)),
        )
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        if str(backend.token_to_id(content)) != str(key):
            logger.warning(
                "%s: added token %r is id %s in tokenizer_config.json but got id %s",
                model_path,
                content,
                key,
                backend.token_to_id(content),
            )


def _post_processor_prefix(backend: RustTokenizer) -> list[int]:
    """Ids the tokenizer.json post-processor puts before the text (e.g. Llama's BOS)."""
    if backend.post_processor is None:
        return []
    with_special = backend.encode("a", add_special_tokens=True).ids
    plain = backend.encode("a", add_special_tokens=False).ids
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start : start + len(plain)] == plain:
            return with_special[:start]
    return []


def _post_processor_suffix(backend: RustTokenizer) -> list[int]:
    """Ids the tokenizer.json post-processor puts after the text (e.g. Qwen3-Embedding's EOS)."""
    if backend.post_processor is None:
        return []
    with_special = backend.encode("a", add_special_tokens=True).ids
    plain = backend.encode("a", add_special_tokens=False).ids
    for end in range(len(with_special), len(plain) - 1, -1):
        if with_special[end - len(plain) : end] == plain:
            return with_special[end:]
    return []


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return []


def _config_eos_ids(model_path: str, vocab_size: int) -> list[int]:
    """End-of-generation ids from generation_config.json and config.json, in that order."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        data = _read_json(model_path, name)
        candidates = _as_id_list(data.get("eos_token_id"))
        text_config = data.get("text_config")
        if isinstance(text_config, dict):
            candidates += _as_id_list(text_config.get("eos_token_id"))
        for token_id in candidates:
            if not 0 <= token_id < vocab_size:
                logger.warning("%s: eos_token_id %d is outside the vocabulary; ignoring it", name, token_id)
            elif token_id not in ids:
                ids.append(token_id)
    return ids


def _chat_templates(model_path: str, config: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """The default chat template and the named ones, with transformers' precedence.

    `chat_template.jinja` beats `chat_template.json` beats tokenizer_config's `chat_template`,
    which is either a string or a list of {"name", "template"} (the default is named "default").
    `additional_chat_templates/<name>.jinja` files add named templates.
    """
    named: dict[str, str] = {}
    default: str | None = None
    value = config.get("chat_template")
    if isinstance(value, str):
        default = value
    elif isinstance(value, list):
        for entry in value:
            if (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                named[entry["name"]] = entry["template"]
        default = named.get("default")
        if default is None and named:
            logger.warning(
                "%s: tokenizer_config.json has chat templates %s but none named 'default'; "
                "pass chat_template=<name> to pick one",
                model_path,
                sorted(named),
            )
    json_template = _read_json(model_path, "chat_template.json").get("chat_template")
    if isinstance(json_template, str):
        default = json_template
    jinja_path = os.path.join(model_path, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        default = _read_text(jinja_path)
    extra_dir = os.path.join(model_path, "additional_chat_templates")
    if os.path.isdir(extra_dir):
        for file_name in sorted(os.listdir(extra_dir)):
            if file_name.endswith(".jinja"):
                named[file_name[: -len(".jinja")]] = _read_text(os.path.join(extra_dir, file_name))
    return default, named


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsupportedModelError(f"{path} is not a readable UTF-8 text file: {exc}") from exc
