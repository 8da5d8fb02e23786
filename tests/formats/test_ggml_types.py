"""GGML tensor types read without the `gguf` package: the table against gguf's own, and a GGUF
start that never imports `gguf` (nor httpx), which cost ~0.1 s of every start."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from fastdeploy.formats.ggml_types import F16, F32, MXFP4, TYPES, GGMLType, ggml_type


def test_every_type_as_gguf_names_and_sizes_it() -> None:
    for qtype in GGMLQuantizationType:
        assert ggml_type(int(qtype)) == GGMLType(qtype.name, *GGML_QUANT_SIZES[qtype]), qtype.name
    for type_id, kind in TYPES.items():  # nothing the installed gguf lacks or sizes otherwise
        assert (kind.block_size, kind.type_size) == GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    assert (F32, F16, MXFP4) == (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.MXFP4,
    )


def test_an_unknown_type_is_none() -> None:
    assert ggml_type(250) is None


def test_a_gguf_start_imports_neither_gguf_nor_httpx(smollm2_path: str) -> None:
    """`from fastdeploy import LLM`, then the loader's whole pass over a GGUF file (config,
    tokenizer, tensors), in a fresh process."""
    script = textwrap.dedent(
        """
        import sys
        from fastdeploy import LLM, SamplingParams
        from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader
        from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader

        loader = GGUFLoader()
        loader.load_config(sys.argv[1])
        GGUFTokenizerLoader().load(sys.argv[1])
        tensors = [tensor.type_name if hasattr(tensor, "type_name") else tensor.dtype
                   for _, tensor in loader.load_tensors(sys.argv[1])]
        assert tensors, "no tensors"
        print(sorted(name for name in ("gguf", "httpx") if name in sys.modules))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, smollm2_path], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
