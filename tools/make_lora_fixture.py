"""Writes tests/fixtures/gguf/tiny-llama-lora-f32.gguf, llama.cpp's GGUF LoRA of a PEFT adapter
for the tiny Llama checkpoint, and tests/fixtures/tiny_lora_reference.json, the greedy tokens
transformers + peft give with that adapter (and without it).

The adapter is tests/lora/lora_fixtures.py's "all-r8" (seeded: rank 8 on q/k/v/o and
gate/up/down), made by `peft` on tests/models/tiny_checkpoints.py's "llama"; llama.cpp's own
`convert_lora_to_gguf.py --outtype f32` converts it. The tests need neither torch, peft nor
llama.cpp. Regenerate with an environment that has torch, transformers, peft and llama.cpp's
sources (its converter ships in the llama-cpp-python sdist, under vendor/llama.cpp)::

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcp  # then unpack it
    python tools/make_lora_fixture.py --llama-cpp path/to/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
GGUF = REPO_ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama-lora-f32.gguf"
REFERENCE = REPO_ROOT / "tests" / "fixtures" / "tiny_lora_reference.json"
ADAPTER = "all-r8"

#: llama.cpp's LoRA converter, run unchanged with its own gguf-py first on the path
_CONVERT = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
script = sys.argv[1] + "/convert_lora_to_gguf.py"
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def load_test_module(name: str, folder: str) -> Any:
    sys.path.insert(0, str(REPO_ROOT / "tests" / folder))
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tests" / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source directory")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tiny = load_test_module("tiny_checkpoints", "models")
    fixtures = load_test_module("lora_fixtures", "lora")
    with tempfile.TemporaryDirectory() as scratch:
        base, adapter = Path(scratch) / "llama", Path(scratch) / "adapter"
        tiny.write_checkpoint(base, "llama", "pt")
        fixtures.make_peft_adapter(str(base), str(adapter), **fixtures.ADAPTERS[ADAPTER])
        env = dict(os.environ, PYTHONPATH=str(args.llama_cpp / "gguf-py"), NO_LOCAL_GGUF="")
        command = [sys.executable, "-c", _CONVERT, str(args.llama_cpp), "--base", str(base)]
        command += ["--outtype", "f32", "--outfile", str(GGUF), str(adapter)]
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        data = {
            "metadata": {
                "generator": "tools/make_lora_fixture.py",
                "transformers_version": transformers.__version__,
                "peft_version": peft.__version__,
                "torch_version": torch.__version__,
                "python_version": platform.python_version(),
                "method": "full forward passes without KV cache; greedy = argmax, no EOS stop",
            },
            "base": "llama",
            "adapter": ADAPTER,
            "gguf_sha256": hashlib.sha256(GGUF.read_bytes()).hexdigest(),
            "prompts": fixtures.PROMPTS,
            "tokens": fixtures.peft_greedy(str(base), str(adapter), fixtures.PROMPTS),
            "base_tokens": fixtures.peft_greedy(str(base), None, fixtures.PROMPTS),
        }
    REFERENCE.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {GGUF.relative_to(REPO_ROOT)} ({GGUF.stat().st_size} bytes) and {REFERENCE.relative_to(REPO_ROOT)}"
    )


if __name__ == "__main__":
    main()
