"""GLM-4.5 (`Glm4MoeForCausalLM`) against transformers' float32 greedy tokens on a tiny random
checkpoint (tests/models/tiny_glm.py), with its multi-token-prediction layer in the files, which
is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_glm as glm
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[list[int]]:
    torch = pytest.importorskip("torch", reason="the reference tokens come from transformers")
    transformers = pytest.importorskip("transformers", reason="the reference tokens come from transformers")
    directory = glm.write_checkpoint(tmp_path_factory.mktemp("glm-hf"), with_mtp=False)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # the names are GLM's own
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=glm.NEW_TOKENS, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in glm.PROMPTS
        ]


def _greedy(directory: Path) -> list[list[int]]:
    llm = LLM(model=str(directory), max_model_len=128, block_size=8, enforce_eager=True)
    params = SamplingParams(temperature=0, max_tokens=glm.NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in glm.PROMPTS], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def test_greedy_tokens_equal_transformers(tmp_path, reference):
    assert_tokens_match(_greedy(glm.write_checkpoint(tmp_path / "glm", with_mtp=True)), reference)


def test_the_partial_rotary_factor_is_read(tmp_path, reference):
    """Full-width rotary (a different model) must change the tokens, so the factor is exercised."""
    assert (
        _greedy(glm.write_checkpoint(tmp_path / "full", with_mtp=False, partial_rotary_factor=1.0))
        != reference
    )


def test_a_missing_routing_field_is_named(tmp_path):
    with pytest.raises(InvalidArgumentError, match="lacks the required field 'n_group'"):
        LLM(model=str(glm.write_checkpoint(tmp_path / "bad", with_mtp=False, n_group=None)), max_model_len=64)
