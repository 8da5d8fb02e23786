"""ERNIE-4.5-VL (`Ernie4_5_VLMoeForConditionalGeneration`) against transformers, and the engine's
handling of images: encoder runs, chunked prefill, prefix caching, preemption, bad requests.

The tiny random-weight checkpoint (tests/models/tiny_vl_checkpoint.py) is written by the test in
the -PT and -Paddle layouts; the references (24 greedy tokens and each step's last-position
logits for text-only, one-image, two-image and video prompts) come from transformers through
tools/make_vl_references.py and are committed in tests/fixtures/ernie4_5_vl_references.json.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from token_match import assert_outputs_match, assert_tokens_match

# the cuda backend's Triton kernels run interpreted on a CPU; triton reads this at their import
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("PIL")
import tiny_checkpoints  # noqa: E402
import tiny_vl_checkpoint as tiny  # noqa: E402
from PIL import Image  # noqa: E402

from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.backends.base import BackendOptions  # noqa: E402
from fastdeploy.backends.cpu import native  # noqa: E402
from fastdeploy.backends.selection import create_backend  # noqa: E402
from fastdeploy.errors import InvalidArgumentError  # noqa: E402
from fastdeploy.input.multimodal.options import ProcessorOptions  # noqa: E402
from fastdeploy.model_executor.model_loader import build_model, inspect_checkpoint  # noqa: E402
from fastdeploy.models.ernie4_5_vl.vision import VisionEncoder  # noqa: E402
from fastdeploy.plugins.registry import get_registry  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGES = FIXTURES / "images"
ATOL = 1e-4
VIDEO_KWARGS = tiny.VIDEO_KWARGS
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def reference() -> dict:
    return tiny.load_references()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for layout in ("pt", "paddle"):
        directory = tmp_path_factory.mktemp(f"ernie-vl-{layout}")
        tiny.write_checkpoint(directory, layout)
        tiny_checkpoints.write_ernie_tokenizer(directory)
        dirs[layout] = str(directory)
    return dirs


@pytest.fixture(scope="module")
def llm(checkpoints) -> LLM:
    return LLM(model=checkpoints["pt"], max_model_len=256, mm_processor_kwargs=VIDEO_KWARGS)


def test_fixture_weights_are_the_ones_the_test_rebuilds(reference):
    assert reference["config"] == tiny.CONFIG
    assert reference["weights_sha256"] == tiny_checkpoints.weights_checksum(tiny.pt_tensors())
    assert {case["name"] for case in reference["cases"]} == {"text", "one_image", "two_images", "video"}


def teacher_forced_logits(model_dir: str, case: dict) -> tuple[list[int], np.ndarray]:
    """Our expanded prompt and the logits of every position of prompt + outputs, in one pass."""
    registry = get_registry()
    checkpoint = inspect_checkpoint(model_dir, registry)
    backend = create_backend("cpu", BackendOptions(threads=1), registry)
    model = build_model(checkpoint, backend, 512, registry)
    factory = registry.multimodal_processors()[checkpoint.config.architecture]
    processor = factory(None, checkpoint.config, ProcessorOptions(mm_processor_kwargs=VIDEO_KWARGS))
    data = tiny.case_media(case)
    prompt = processor.process(case["prompt_token_ids"], data.get("image", []), data.get("video", []))
    ids = prompt.token_ids + case["output_token_ids"][:-1]
    logits = tiny_checkpoints.prefill_logits(model, backend, ids, extra_inputs=[(prompt, 0, len(ids))])
    return prompt.token_ids, logits


@pytest.mark.parametrize("layout", ["pt", "paddle"])
@pytest.mark.parametrize("name", ["text", "one_image", "two_images", "video"])
def test_logits_match_transformers(name, layout, checkpoints, reference):
    case = next(case for case in reference["cases"] if case["name"] == name)
    expanded, logits = teacher_forced_logits(checkpoints[layout], case)
    assert expanded == case["expanded_token_ids"]
    steps = logits[len(expanded) - 1 :]
    np.testing.assert_allclose(steps, np.asarray(case["step_logits"]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["pt", "paddle"])
def test_llm_generates_the_reference_greedy_tokens(layout, checkpoints, reference):
    llm = LLM(model=checkpoints[layout], max_model_len=256, mm_processor_kwargs=VIDEO_KWARGS)
    cases = reference["cases"]
    outputs = llm.generate([tiny.case_prompt(case) for case in cases], GREEDY, use_tqdm=False)
    names = [case["name"] for case in cases]
    assert_outputs_match(outputs, [case["output_token_ids"] for case in cases], names)
    assert [o.prompt_token_ids for o in outputs] == [case["expanded_token_ids"] for case in cases]
    assert outputs[1].num_input_image_tokens == 24 and outputs[3].num_input_video_tokens == 18


@pytest.mark.parametrize("device", ["torch-cpu", "torch-cpu+triton", "paddle-cpu"])
def test_the_cuda_backends_code_generates_the_reference_greedy_tokens(
    device, checkpoints, reference, monkeypatch
):
    """The cuda backend's own code (its CPU twins; "+triton": its Triton kernels, interpreted), with
    the vision tower's ops on the device: encoding an image copies nothing back to the host."""
    name, _, kernels = device.partition("+")
    pytest.importorskip(name.split("-")[0], reason=f"the {name} backend needs {name.split('-')[0]}")
    if kernels:
        pytest.importorskip("triton", reason="the Triton kernels need triton")
        monkeypatch.setenv("FD_CUDA_KERNELS", kernels)
    llm = LLM(model=checkpoints["pt"], device=name, max_model_len=256, mm_processor_kwargs=VIDEO_KWARGS)
    backend = llm.llm_engine.backend
    host_copies = []
    original_encode = VisionEncoder.encode

    def encode_counting_host_copies(self, patches, grid_thw):
        with monkeypatch.context() as patch:
            patch.setattr(
                backend,
                "to_numpy",
                lambda t: host_copies.append(t.shape) or type(backend).to_numpy(backend, t),
            )
            return original_encode(self, patches, grid_thw)

    monkeypatch.setattr(VisionEncoder, "encode", encode_counting_host_copies)
    # interpreted, each decode step takes most of a second: 8 tokens there (decoding after the
    # image and video positions in all four cases); all 24 on the CPU twins and in
    # test_llm_generates_the_reference_greedy_tokens
    new_tokens = 8 if kernels else GREEDY.max_tokens
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    cases = reference["cases"]
    outputs = llm.generate([tiny.case_prompt(case) for case in cases], params, use_tqdm=False)
    expected = [case["output_token_ids"][:new_tokens] for case in cases]
    assert_outputs_match(outputs, expected, [case["name"] for case in cases])
    assert host_copies == []


def count_encodes(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    original = VisionEncoder.encode

    def counting(self, patches, grid_thw):
        calls.append(grid_thw)
        return original(self, patches, grid_thw)

    monkeypatch.setattr(VisionEncoder, "encode", counting)
    return calls


def test_chunked_prefill_encodes_each_image_once_and_places_it_right(checkpoints, reference, monkeypatch):
    """A 16-token budget splits both images of the two-image prompt across several passes."""
    case = next(case for case in reference["cases"] if case["name"] == "two_images")
    calls = count_encodes(monkeypatch)
    llm = LLM(model=checkpoints["pt"], max_model_len=256, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2)
    output = llm.generate(tiny.case_prompt(case), params, use_tqdm=False)[0]
    assert [sample.token_ids for sample in output.outputs] == [case["output_token_ids"]] * 2
    assert sorted(calls) == [(1, 6, 18), (1, 14, 6)]  # once per image, for both samples


def test_prefix_cache_keys_include_the_image(checkpoints, reference):
    """Two prompts that differ only in the image have equal token ids but must not share blocks."""
    case = next(case for case in reference["cases"] if case["name"] == "one_image")
    flipped = np.asarray(Image.open(IMAGES / "chelsea_180x120.png"))[::-1]
    other = dict(tiny.case_prompt(case), multimodal_data={"image": [flipped]})
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    llm = LLM(model=checkpoints["pt"], max_model_len=256, block_size=16, enable_prefix_caching=True)
    first = llm.generate(tiny.case_prompt(case), params, use_tqdm=False)[0]
    same = llm.generate(tiny.case_prompt(case), params, use_tqdm=False)[0]
    different = llm.generate(other, params, use_tqdm=False)[0]
    uncached = LLM(model=checkpoints["pt"], max_model_len=256).generate(other, params, use_tqdm=False)[0]
    assert same.num_cached_tokens == 16 and same.outputs.token_ids == first.outputs.token_ids
    assert different.num_cached_tokens == 0  # the first block holds image tokens
    logprob = [next(iter(step.values())) for step in different.outputs.logprobs]
    assert logprob == pytest.approx(
        [next(iter(step.values())) for step in uncached.outputs.logprobs], abs=1e-5
    )
    assert logprob != pytest.approx([next(iter(step.values())) for step in first.outputs.logprobs], abs=1e-3)


def test_preemption_recomputes_multimodal_sequences(checkpoints, reference):
    """Four video/image prompts in a KV cache too small for all of them at once."""
    cases = [case for case in reference["cases"] if case["name"] != "text"]
    llm = LLM(
        model=checkpoints["pt"],
        max_model_len=96,
        block_size=16,
        num_gpu_blocks_override=7,
        mm_processor_kwargs=VIDEO_KWARGS,
    )
    outputs = llm.generate([tiny.case_prompt(case) for case in cases], GREEDY, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_tokens_match(
        [o.outputs.token_ids for o in outputs],
        [case["output_token_ids"] for case in cases],
        [case["name"] for case in cases],
    )


def test_a_bad_image_fails_alone(llm, reference):
    case = next(case for case in reference["cases"] if case["name"] == "one_image")
    bad = dict(tiny.case_prompt(case), multimodal_data={"image": [b"definitely not a png"]})
    too_many = dict(
        tiny.case_prompt(case), multimodal_data={"image": [Image.open(IMAGES / "camera_64x64_gray.png")] * 2}
    )
    outputs = llm.generate([bad, tiny.case_prompt(case), too_many], GREEDY, use_tqdm=False)
    assert outputs[0].error_code == 400 and "image 0" in outputs[0].error_msg
    assert outputs[2].error_code == 400 and "placeholder" in outputs[2].error_msg
    assert outputs[1].error_code == 200 and outputs[1].outputs.token_ids == case["output_token_ids"]


def test_limit_mm_per_prompt_is_enforced_per_request(checkpoints, reference):
    case = next(case for case in reference["cases"] if case["name"] == "two_images")
    llm = LLM(model=checkpoints["pt"], max_model_len=256, limit_mm_per_prompt={"image": 1})
    output = llm.generate(tiny.case_prompt(case), GREEDY, use_tqdm=False)[0]
    assert output.error_code == 400 and "limit_mm_per_prompt" in output.error_msg


def test_text_only_models_refuse_images(tmp_path):
    tiny_checkpoints.write_checkpoint(tmp_path, "ernie4_5", "pt")
    tiny_checkpoints.write_ernie_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=64)
    output = llm.generate(
        {"prompt_token_ids": [1, 5, 7], "multimodal_data": {"image": [b"x"]}}, use_tqdm=False
    )[0]
    assert output.error_code == 400 and "text only" in output.error_msg


@pytest.mark.parametrize("sizes", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_tensor_and_pipeline_parallelism_are_refused_naming_the_architecture(checkpoints, sizes):
    with pytest.raises(InvalidArgumentError) as error:
        LLM(model=checkpoints["pt"], max_model_len=256, **sizes)
    message = str(error.value)
    assert "Ernie4_5_VLMoeForConditionalGeneration does not support tensor or pipeline parallelism" in message


def test_a_model_in_rank_processes_refuses_images_saying_why(checkpoints, reference):
    case = next(case for case in reference["cases"] if case["name"] == "one_image")
    llm = LLM(model=checkpoints["pt"], max_model_len=256, distributed_executor_backend="mp")
    try:
        output = llm.generate(tiny.case_prompt(case), GREEDY, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    assert output.error_code == 400
    assert "runs in rank processes here" in output.error_msg and "engine process" in output.error_msg


@pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)
def test_bfloat16_vision_matmuls_stay_within_bfloat16_error_of_float32(checkpoints, reference, monkeypatch):
    """The opt-in: every image and video item's encoder output within bfloat16's error of the float32
    default's, yet not equal to it; the text-only case untouched; and the greedy choices of the
    one-image and video cases unchanged. (The two-image case's first two candidates are closer
    than bfloat16 can tell apart in this random-weight model: its first token changes.)"""
    cases = {case["name"]: case for case in reference["cases"]}
    outputs = {}
    for setting in ("float32", "bfloat16"):
        monkeypatch.setenv("FD_CPU_VISION_MATMUL", setting)
        registry = get_registry()
        checkpoint = inspect_checkpoint(checkpoints["pt"], registry)
        backend = create_backend("cpu", BackendOptions(threads=2), registry)
        model = build_model(checkpoint, backend, 512, registry)
        factory = registry.multimodal_processors()[checkpoint.config.architecture]
        processor = factory(None, checkpoint.config, ProcessorOptions(mm_processor_kwargs=VIDEO_KWARGS))
        items = []
        for name in ("one_image", "two_images", "video"):
            data = tiny.case_media(cases[name])
            prompt = processor.process(
                cases[name]["prompt_token_ids"], data.get("image", []), data.get("video", [])
            )
            items += [
                backend.to_numpy(model.vision.encode(item.patches, item.grid_thw)) for item in prompt.items
            ]
        outputs[setting] = items
    for exact, approximate in zip(outputs["float32"], outputs["bfloat16"], strict=True):
        error = np.abs(approximate - exact).max() / np.abs(exact).max()
        assert 1e-4 < error < 5e-2
    llm = LLM(model=checkpoints["pt"], max_model_len=256, mm_processor_kwargs=VIDEO_KWARGS)
    assert "vision encoder matmuls in bfloat16" in llm.llm_engine.backend.describe()
    names = ("text", "one_image", "video")
    outputs = [llm.generate(tiny.case_prompt(cases[name]), GREEDY, use_tqdm=False)[0] for name in names]
    assert_tokens_match(
        [o.outputs.token_ids for o in outputs], [cases[name]["output_token_ids"] for name in names], names
    )
