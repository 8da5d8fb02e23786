"""Faults inside the engine fail only the requests they touch.

The faults come from a test-only plugin (tests/fault_injection) installed as a distribution and
found through its entry point, like any third-party plugin: a device backend whose ops raise or
produce NaN for passes containing a marker token, and a reasoning parser that raises mid-output.
Each case runs the victims together with bystanders in one batch; the bystanders must get exactly
the tokens the plain cpu engine (the shared `llm` fixture) gives them.
"""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.fault_isolation import FORWARD_ERROR, NONFINITE_LOGITS
from fastdeploy.errors import EngineDeadError, KVCacheAllocationError

RAISE_TOKEN, NAN_TOKEN, DEAD_TOKEN = 49100, 49101, 49102
BYSTANDERS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ENGINE = {"max_model_len": 1024, "max_num_seqs": 32}
KV_BLOCKS = 16  # 1024 tokens in blocks of 64


@pytest.fixture(scope="module", params=[False, True], ids=["stepwise", "async-scheduling"])
def faulty(fault_env, request):
    """With async scheduling a raising op fails the launch (the pass runs again stepwise, where
    isolation finds the culprit) and NaN rows are found when the tokens land a step later."""
    fault_env.setenv("FD_FAULT_RAISE_TOKEN", str(RAISE_TOKEN))
    fault_env.setenv("FD_FAULT_NAN_TOKEN", str(NAN_TOKEN))
    # the smallest cache (one max_model_len sequence): freed blocks come back into use quickly
    return LLM(device="faulty", num_gpu_blocks_override=KV_BLOCKS, async_scheduling=request.param, **ENGINE)


@pytest.fixture(scope="module")
def expected(llm) -> list[list[int]]:
    return [o.outputs.token_ids for o in llm.generate(BYSTANDERS, PARAMS, use_tqdm=False)]


def victim(llm, marker: int) -> list[int]:
    return [*llm.get_tokenizer().encode("Tell me about"), marker, *llm.get_tokenizer().encode(" please")]


def run_mixed(engine: LLM, victims: list[list[int]]) -> tuple[list, list]:
    prompts = [*BYSTANDERS[:2], *({"prompt_token_ids": ids} for ids in victims), *BYSTANDERS[2:]]
    outputs = engine.generate(prompts, PARAMS, use_tqdm=False)
    middle = outputs[2 : 2 + len(victims)]
    return [*outputs[:2], *outputs[2 + len(victims) :]], middle


def faults_of(engine: LLM) -> dict[str, str]:
    return {fault.request_id: fault.kind for fault in engine.llm_engine.fault_isolation.faults_in_step}


def test_a_raising_op_fails_only_its_request(faulty, expected, llm):
    bystanders, (failed,) = run_mixed(faulty, [victim(llm, RAISE_TOKEN)])
    assert [o.outputs.token_ids for o in bystanders] == expected
    assert all(o.error_code == 200 for o in bystanders)
    assert failed.error_code == 500 and failed.finished
    assert "forward pass failed" in failed.error_msg and "embedding op raised" in failed.error_msg
    assert failed.outputs.finish_reason == "abort"


def test_nan_logits_fail_only_their_request_and_leave_no_trace(faulty, expected, llm):
    bystanders, (failed,) = run_mixed(faulty, [victim(llm, NAN_TOKEN)])
    assert [o.outputs.token_ids for o in bystanders] == expected
    assert failed.error_code == 500 and "NaN or infinite logits" in failed.error_msg
    # the victim's KV block (NaN inside) goes back to the free list; cycling through every block
    # hands it to a later request, which must not care
    for _ in range(KV_BLOCKS // len(BYSTANDERS)):
        again = faulty.generate(BYSTANDERS, PARAMS, use_tqdm=False)
        assert [o.outputs.token_ids for o in again] == expected
    blocks = faulty.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_fault_kinds_are_recorded_per_request(faulty, llm):
    engine = faulty.llm_engine
    engine.add_request("raise", victim(llm, RAISE_TOKEN), PARAMS)
    engine.add_request("nan", victim(llm, NAN_TOKEN), PARAMS)
    engine.add_request("fine", llm.get_tokenizer().encode("Hello"), PARAMS)
    outputs = {output.request_id: output for output in engine.step()}
    assert faults_of(faulty) == {"raise": FORWARD_ERROR, "nan": NONFINITE_LOGITS}
    assert outputs["raise"].error_code == outputs["nan"].error_code == 500
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
    assert outputs["fine"].error_code == 200 and len(outputs["fine"].outputs.token_ids) == 8


@pytest.mark.parametrize("marker", [RAISE_TOKEN, NAN_TOKEN])
def test_a_pass_where_every_request_fails_probes_the_device_and_goes_on(
    faulty, expected, llm, marker, caplog
):
    (failed,) = faulty.generate([{"prompt_token_ids": victim(llm, marker)}], PARAMS, use_tqdm=False)
    assert failed.error_code == 500
    assert "probe pass succeeded" in caplog.text
    # the one-token probe on its scratch KV block found the device working: the engine goes on
    outputs = faulty.generate(BYSTANDERS, PARAMS, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected


@pytest.fixture(scope="module")
def pipelined():
    """Two pipeline stages in worker processes: batches go through `MicroBatchPipeline.step`."""
    engine = LLM(pipeline_parallel_size=2, **ENGINE)
    yield engine
    engine.shutdown()


def test_kv_allocation_failure_fails_only_its_request(faulty, expected, llm, monkeypatch):
    check_kv_allocation_failure(faulty, expected, llm, monkeypatch)


def test_kv_allocation_failure_fails_only_its_request_in_a_pipeline(pipelined, expected, llm, monkeypatch):
    check_kv_allocation_failure(pipelined, expected, llm, monkeypatch)


def check_kv_allocation_failure(engine: LLM, expected, llm, monkeypatch) -> None:
    blocks = engine.llm_engine.block_manager
    marker = victim(llm, 17)
    allocate = blocks.allocate

    def failing_allocate(seq, num_new_tokens):
        if seq.prompt_token_ids == marker:
            raise MemoryError("injected fault: no KV block for this sequence")
        allocate(seq, num_new_tokens)

    monkeypatch.setattr(blocks, "allocate", failing_allocate)
    bystanders, (failed,) = run_mixed(engine, [marker])
    assert [o.outputs.token_ids for o in bystanders] == expected
    assert failed.error_code == 500 and "KV blocks could not be allocated" in failed.error_msg
    monkeypatch.undo()
    assert blocks.num_free_blocks == blocks.num_blocks


def test_parser_that_raises_mid_output_fails_only_its_request(fault_env, llm):
    reference = llm.generate(BYSTANDERS, PARAMS, use_tqdm=False)
    texts = [o.outputs.text for o in reference]
    # a word the first answer writes after its first tokens, and no other answer contains
    trigger = next(
        word for word in texts[0].split()[1:] if len(word) > 2 and not any(word in text for text in texts[1:])
    )
    fault_env.setenv("FD_FAULT_PARSER_TRIGGER", trigger)
    engine = LLM(reasoning_parser="faulty", **ENGINE)
    outputs = engine.generate(BYSTANDERS, PARAMS, use_tqdm=False)
    assert outputs[0].error_code == 500 and "the parser met" in outputs[0].error_msg
    assert [o.outputs.text for o in outputs[1:]] == texts[1:]
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_lost_device_raises_engine_dead(fault_env, llm):
    fault_env.setenv("FD_FAULT_DEAD_TOKEN", str(DEAD_TOKEN))
    engine = LLM(device="faulty", **ENGINE)
    with pytest.raises(EngineDeadError, match="probe pass failed too"):
        engine.generate(
            [BYSTANDERS[0], {"prompt_token_ids": victim(llm, DEAD_TOKEN)}], PARAMS, use_tqdm=False
        )


def test_kv_cache_that_cannot_be_allocated_is_a_clear_startup_error(fault_env):
    fault_env.setenv("FD_FAULT_KV_ALLOCATION", "fail")
    with pytest.raises(KVCacheAllocationError, match="could not allocate the KV cache"):
        LLM(device="faulty", **ENGINE)
    fault_env.delenv("FD_FAULT_KV_ALLOCATION")


def test_a_token_that_cannot_be_processed_fails_only_its_request(faulty, expected, llm, monkeypatch):
    """The detokenizer (a tokenizer plugin's decode) raising for one sequence's token fails that
    request alone; before, the whole step failed and took every request in flight with it."""
    from fastdeploy.engine import output_processor as engine_module  # where process_token is called

    marker = victim(llm, 23)
    process = engine_module.process_token

    def failing_process(seq, token, *args):
        if seq.prompt_token_ids == marker and seq.num_output_tokens == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected fault: cannot decode")
        process(seq, token, *args)

    monkeypatch.setattr(engine_module, "process_token", failing_process)
    bystanders, (failed,) = run_mixed(faulty, [marker])
    assert [o.outputs.token_ids for o in bystanders] == expected
    assert failed.error_code == 500 and "processing a sampled token failed" in failed.error_msg
    assert "UnicodeDecodeError" in failed.error_msg
    monkeypatch.undo()
    blocks = faulty.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks
