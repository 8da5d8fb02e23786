"""Reference greedy tokens of the tiny Phi-3/Phi-4/Mixtral/Qwen2-MoE/Qwen3-MoE/Gemma 2/Gemma 3 checkpoints
(and a Phi-3 whose every layer has a sliding window) from
transformers, and the GGUF files llama.cpp's own converter writes of them (and of the tiny
ERNIE-4.5 dense and MoE checkpoints).

Why this exists
---------------
fastdeploy implements these architectures itself and reads both their Hugging Face directories
and llama.cpp's GGUF files. To test both against independent code, this tool

* writes each tiny random-weight model of tests/models/tiny_families.py (seeded numpy weights,
  Hugging Face names) to a temporary directory, loads it with transformers' own classes
  (`AutoModelForCausalLM.from_pretrained`, which must report no missing, unexpected or
  mismatched tensors) in float32, and records for every prompt 24 greedy tokens (argmax of a
  full forward pass over prompt + tokens so far, no EOS stop), the logits of the first step,
  and the smallest top-1/top-2 margin over all steps (how far greedy choices are from ties);
  for a model with attention soft-capping (Gemma 2, run with eager attention) also the greedy
  tokens of the same weights without the cap, so the tests can show the cap binds;
  the same for the tiny ERNIE-4.5 dense and MoE models of tests/models/tiny_checkpoints.py
  (over 24 tokens, where tiny_model_references.json has 8); the result is
  tests/fixtures/tiny_family_references.json;
* trains a 160-piece SentencePiece tokenizer (the converter needs a real one) on
  tests/fixtures/perplexity_text.txt, puts it beside each checkpoint, and runs llama.cpp's
  `convert_hf_to_gguf.py --outtype f32` on the directory (and `--outtype q8_0` for Mixtral, whose
  stacked experts the loader then splits in their blocks, and for Gemma 2), writing
  tests/fixtures/gguf/*.gguf; for each block-quantised file, transformers' greedy tokens on
  exactly the weights it holds (dequantised by the `gguf` package) join the model's entry as
  `block_references`, since quantisation alone may move a greedy choice of a tiny model.

The tests need neither torch, transformers nor llama.cpp. Regenerate with an environment that
has torch, transformers, sentencepiece and llama.cpp's sources (its converter ships in the
llama-cpp-python sdist, under vendor/llama.cpp)::

    python tools/make_family_references.py --llama-cpp path/to/vendor/llama.cpp [--only gemma2 ...]

`--only` remakes the named models' entries and GGUFs and keeps the others as committed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGMLQuantizationType, GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from fastdeploy.model_executor.loaders.gguf_loader import expert_tensor_names, hf_tensor_name  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DECIMALS = 6
#: the tiny ERNIE-4.5 models of tiny_checkpoints.py that are also converted to GGUF
ERNIE_MODELS = ("ernie4_5", "ernie4_5_moe")


def load_test_module(name: str) -> Any:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "models"))
    path = REPO_ROOT / "tests" / "models" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rounded(values: torch.Tensor) -> list[float]:
    return np.round(values.double().numpy(), DECIMALS).tolist()


def write_any(tiny: Any, families: Any, directory: Path | str, name: str) -> dict[str, Any]:
    """Write tiny model `name` (a family model, or one of the ERNIE models) as a Hugging Face directory."""
    if name in ERNIE_MODELS:
        return tiny.write_checkpoint(directory, name, "pt")
    return families.write_checkpoint(directory, name)


def load_reference_model(directory: str, name: str, **config_changes: Any) -> Any:
    """transformers' float32 model of the checkpoint in `directory` (eager attention where the
    scores are soft-capped, which only it implements), which must load cleanly."""
    options: dict[str, Any] = dict(config_changes)
    if json.loads(Path(directory, "config.json").read_text(encoding="utf-8")).get("attn_logit_softcapping"):
        options["attn_implementation"] = "eager"
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True, **options
    )
    problems = {key: sorted(value) for key, value in info.items() if value}
    if problems:
        sys.exit(f"{name}: transformers did not load the tiny checkpoint cleanly: {problems}")
    return model.eval()


def greedy(model: Any, prompt: list[int], steps: int, margins: list[float]) -> tuple[list[int], list[float]]:
    """`steps` greedy tokens after `prompt` and the first step's logits; appends each step's
    top-1/top-2 margin to `margins`."""
    ids = list(prompt)
    first = None
    for _ in range(steps):
        with torch.no_grad():
            last = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        top2 = torch.topk(last, 2).values
        margins.append(float(top2[0] - top2[1]))
        first = rounded(last) if first is None else first
        ids.append(int(torch.argmax(last)))
    return ids[len(prompt) :], first


def reference_for(tiny: Any, families: Any, name: str) -> dict[str, Any]:
    spec = tiny.SPECS[name] if name in ERNIE_MODELS else families.SPECS[name]
    with tempfile.TemporaryDirectory() as directory:
        weights = write_any(tiny, families, directory, name)
        model = load_reference_model(directory, name)
        uncapped = None
        if spec["config"].get("attn_logit_softcapping"):
            uncapped = load_reference_model(directory, name, attn_logit_softcapping=None)
    margins: list[float] = []
    sets = {}
    for set_name, (prompts, max_model_len) in families.prompt_sets(name).items():
        cases = []
        for prompt in prompts:
            tokens, first = greedy(model, prompt, families.NEW_TOKENS, margins)
            assert len(prompt) + len(tokens) <= max_model_len, (name, set_name)
            case = {"prompt_token_ids": prompt, "output_token_ids": tokens, "first_logits": first}
            if uncapped is not None:
                case["output_token_ids_without_attention_softcap"] = greedy(
                    uncapped, prompt, families.NEW_TOKENS, []
                )[0]
            cases.append(case)
        sets[set_name] = {"max_model_len": max_model_len, "cases": cases}
    entry = {
        "model_class": type(model).__name__,
        "config": spec["config"],
        "seed": spec["seed"],
        "weights_sha256": tiny.weights_checksum(weights),
        "min_top1_top2_margin": round(min(margins), 6),
        "prompt_sets": sets,
    }
    print(f"{name}: {entry['model_class']} margin {entry['min_top1_top2_margin']}")
    return entry


def block_reference(
    tiny: Any, families: Any, name: str, path: Path, directory: Path
) -> dict[str, list[list[int]]]:
    """transformers' greedy tokens, per prompt set, on exactly the weights the block-quantised
    GGUF at `path` holds (its quantised tensors dequantised by the `gguf` package, the others
    the seeded ones): the float reference of what an engine computes from that file."""
    weights = families.tensors(name)
    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    for tensor in reader.tensors:
        kind = GGMLQuantizationType(tensor.tensor_type)
        if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            continue
        values = dequantize(tensor.data, kind).astype(np.float32)
        if values.ndim == 3:
            for expert, rows in zip(expert_tensor_names(tensor.name, arch, len(values)), values, strict=True):
                weights[expert] = rows
        else:
            hf_name = hf_tensor_name(tensor.name, arch)
            weights[hf_name] = values.reshape(weights[hf_name].shape)
    directory.mkdir(parents=True)
    tiny.write_safetensors(directory, weights)
    (directory / "config.json").write_text(json.dumps(families.SPECS[name]["config"]), encoding="utf-8")
    model = load_reference_model(str(directory), name)
    return {
        set_name: [greedy(model, prompt, families.NEW_TOKENS, [])[0] for prompt in prompts]
        for set_name, (prompts, _) in families.prompt_sets(name).items()
    }


def train_tokenizer(directory: Path, vocab_size: int) -> Path:
    """A SentencePiece BPE model of `vocab_size` pieces (<unk>, <s>, </s> first) from the fixture text."""
    text = (REPO_ROOT / "tests" / "fixtures" / "perplexity_text.txt").read_text(encoding="utf-8")
    corpus = directory / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    prefix = directory / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def write_bpe_tokenizer(directory: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer.json of `vocab_size` tokens (256 bytes, then merges) trained on
    the fixture text, as Qwen's tokenizers are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    text = (REPO_ROOT / "tests" / "fixtures" / "perplexity_text.txt").read_text(encoding="utf-8")
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


#: runs llama.cpp's converter unchanged except that a BPE vocabulary whose pre-tokenizer it does
#: not recognise (it knows those of published models by a hash of their token ids, which a tiny
#: vocabulary cannot match) is labelled "qwen2", the pre-tokenizer of the models it stands for
_CONVERT = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from conversion import base
recognised = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return recognised(self, tokenizer)
    except NotImplementedError:
        return "qwen2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def convert(llama_cpp: Path, model_dir: Path, tokenizer: Path, target: Path, outtype: str = "f32") -> None:
    """Run llama.cpp's converter on `model_dir` (`tokenizer` as its tokenizer.model, or a
    byte-level BPE tokenizer.json for the Qwen MoE models)."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config["model_type"] in ("qwen2_moe", "qwen3_moe"):
        write_bpe_tokenizer(model_dir, config["vocab_size"])
    else:
        shutil.copy(tokenizer, model_dir / "tokenizer.model")
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"), NO_LOCAL_GGUF="")
    command = [
        sys.executable,
        "-c",
        _CONVERT,
        str(llama_cpp),
        str(model_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(target),
    ]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"wrote {target.relative_to(REPO_ROOT)} ({target.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source directory")
    parser.add_argument("--only", nargs="+", metavar="MODEL", help="remake only these models")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tiny = load_test_module("tiny_checkpoints")
    families = load_test_module("tiny_families")
    names = [*families.SPECS, *ERNIE_MODELS]
    unknown = set(args.only or ()) - set(names)
    if unknown:
        parser.error(f"--only: unknown models {sorted(unknown)} (known: {', '.join(names)})")
    remade = args.only or names
    kept = {}
    if args.only:
        kept = json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"]
    data = {
        "metadata": {
            "generator": "tools/make_family_references.py",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "numpy_version": np.__version__,
            "python_version": platform.python_version(),
            "dtype": "float32",
            "method": "full forward passes without KV cache; greedy = argmax, no EOS stop",
            "decimals": DECIMALS,
        },
        "models": {
            name: reference_for(tiny, families, name) if name in remade else kept[name] for name in names
        },
    }
    families.GGUF_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        tokenizer = train_tokenizer(scratch, families.SPECS["phi3"]["config"]["vocab_size"])
        digests = {}
        for name in [n for n in [*families.GGUF_MODELS, *ERNIE_MODELS] if n in remade]:
            model_dir = scratch / name
            write_any(tiny, families, model_dir, name)
            for outtype in ["f32", *families.QUANTISED_GGUFS.get(name, ())]:
                target = families.gguf_path(name, outtype)
                convert(args.llama_cpp, model_dir, tokenizer, target, outtype)
                digests[target.name] = hashlib.sha256(target.read_bytes()).hexdigest()
                if outtype != "f32":
                    entry = data["models"][name].setdefault("block_references", {})
                    entry[outtype] = block_reference(
                        tiny, families, name, target, scratch / f"{name}-{outtype}-dequantised"
                    )
    print(json.dumps(digests, indent=1))
    families.REFERENCES.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {families.REFERENCES.relative_to(REPO_ROOT)} ({families.REFERENCES.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
