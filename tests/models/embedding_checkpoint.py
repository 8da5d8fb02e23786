"""Tiny random Qwen3 embedding models saved by sentence-transformers, for the pooling runner's tests
and benchmarks/embeddings.py.

The model is a transformers `Qwen3Model` with seeded random weights (norm weights drawn too, so
no layer is an identity); sentence-transformers wraps it with a Pooling module (and a Normalize
module) and saves it as such a checkpoint is published: the bare decoder (`Qwen3Model`, tensors
without `model.`), `modules.json`, `1_Pooling/config.json`, `config_sentence_transformers.json`
with the prompts. The tokenizer is word-level, and its post-processor appends `<|endoftext|>`
as Qwen3-Embedding's does (last-token pooling reads that token).

`build(..., chat_template=CHATML)` gives the tokenizer a chat template (and its `<|im_start|>` /
`<|im_end|>` tokens, after the other pieces so the words keep their ids): sentence-transformers 6
then saves a "message" modality, and embeds each text as a user message rendered by the template.

Needs torch, transformers and sentence-transformers (the tests skip without them).
"""

from __future__ import annotations

from typing import Any

SPECIALS = ["<pad>", "<unk>", "<|endoftext|>"]
_TEXT = (
    "the a an of to in on at for with by from is are was be it this that these those river "
    "mountain city sea forest bank money loan rate market stock price water fish boat bridge "
    "road car train plane bird tree leaf rain snow wind sun moon star night day morning "
    "evening cold warm hot fast slow big small old new red blue green what where when how "
    "why who which paris france capital country people language music book paper pen school "
    "teacher student question answer passage search query find retrieve relevant given web"
)
WORDS = _TEXT.split()
#: Qwen3-Embedding's instruction format, as its config_sentence_transformers.json stores it
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
#: the pieces a chat template adds (appended to the vocabulary of a checkpoint that has one)
CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>"]
#: a ChatML template that renders content as a string (sentence-transformers' "flat" format)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: the same with content as a list of typed parts (sentence-transformers' "structured" format)
CHATML_PARTS = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary(extra_words: int = 0, chat: bool = False) -> list[str]:
    """The tokenizer's pieces: specials, the words, `extra_words` filler words w0, w1, ..., then
    with `chat` the chat template's pieces."""
    return SPECIALS + WORDS + [f"w{i}" for i in range(extra_words)] + (CHAT_SPECIALS if chat else [])


def write_tokenizer(directory: str, extra_words: int = 0, chat_template: str | None = None) -> None:
    """A word-level tokenizer.json (+ tokenizer_config.json) that appends `<|endoftext|>`; with
    `chat_template`, that template and its pieces as special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(vocabulary(extra_words, chat_template is not None))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", vocab["<|endoftext|>"])]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="<|endoftext|>"
    )
    if chat_template is not None:
        wrapped.add_special_tokens({"additional_special_tokens": CHAT_SPECIALS})
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(directory)


def build(
    directory: str,
    pooling_mode: str,
    normalize: bool,
    *,
    seed: int = 29,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 64,
    extra_words: int = 0,
    prompts: dict[str, str] | None = None,
    config_extra: dict[str, Any] | None = None,
    chat_template: str | None = None,
    processing_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Save a sentence-transformers model of a random Qwen3 as `directory` (the transformers model
    goes to `directory`-base first); returns it (the SentenceTransformer, float32 on the CPU) for
    the reference embeddings. `chat_template` gives the tokenizer one (see the module's doc);
    `processing_kwargs` are the Transformer module's (e.g. {"chat_template": {...}})."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(vocabulary(extra_words, chat_template is not None)),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        **(config_extra or {}),
    )
    model = Qwen3Model(config).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
    base = directory.rstrip("/") + "-base"  # what the Transformer module reads; saved again below
    model.save_pretrained(base)
    write_tokenizer(base, extra_words, chat_template)
    transformer = Transformer(base, processing_kwargs=processing_kwargs)
    modules = [transformer, Pooling(hidden_size, pooling_mode=pooling_mode)]
    if normalize:
        modules.append(Normalize())
    st_model = SentenceTransformer(modules=modules, prompts=prompts or {}, device="cpu")
    st_model.save(directory)
    return st_model
