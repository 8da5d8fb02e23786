"""Everything issue 9 asks of an NVIDIA GPU, in one run, with a summary at the end.

    pip install -e . && python tools/gpu_check.py [--out gpu_check_out] [--quick]

Steps (each a subprocess, its output kept in --out):
  1. `fastdeploy env`: which runtime (paddle / torch) runs the cuda backend, and why;
  2. the GPU tests (`pytest -m gpu tests/gpu`): float32 greedy tokens equal transformers' over
     32 tokens, bfloat16 first 8 tokens and log-probabilities, for Llama, Qwen3 and ERNIE-4.5
     MoE at SmolLM2 and Llama-3.2-1B shapes;
  3. the CPU-side suites of the cuda backend, now with a GPU present (conformance on `cuda`);
  4. the kernel benchmarks against torch (benchmarks/cuda_kernels.py; the quantised matmuls of
     issue 32 among them, `--kernel quant`);
  5. the engine against transformers (benchmarks/throughput.py --device cuda), with a column per
     weight quantisation (wint8, wint4, fp8);
  6. greedy agreement and perplexity of each quantisation against bf16 (benchmarks/accuracy.py
     --device cuda, 8 prompts x 32 tokens);
  7. sliding windows, attention sinks and soft-capping (issues 28 and 29): GPT-OSS (sinks, a
     window of 8) and Gemma 2 (capped, sliding) on `cuda` against transformers' tokens. The compiled kernels against float64, the window's
     cost over a 32k context and a sliding Phi-3 with real CUDA graphs are in step 2
     (tests/gpu/test_gpu_attention_windows.py), the capability checks in step 3, the windowed
     kernels' speed in step 4 (`--kernel window`);
  8. multi-head latent attention (issue 29): DeepSeek-V3 on `cuda` against transformers'
     tokens (chunked prefill, a prefix-cache hit, decode in CUDA graphs), and with MTP
     speculative decoding; the latent kernels' speed is in step 4 (`--kernel latent`), the
     capability check in step 3;
  9. single-stream decode tok/s and its fraction of the HBM roofline (weight bytes x tok/s /
     bandwidth), greedy and sampled, with CUDA graphs on and off (benchmarks/decode_roofline.py;
     issue 32's goal: >= 50% for the 1B shape in bf16).
`--quick` keeps the SmolLM2 shape only. Nothing is installed; a missing module is reported.

On a GPU machine without a package registry (`pip install -e .` cannot fetch the build backend),
install the missing dependencies from carried wheels with `pip install --no-deps --target DIR`,
put DIR and the checkout on PYTHONPATH, and copy the package's `METADATA` and `entry_points.txt`
(from a `fastdeploy-*.dist-info` made by an install elsewhere) into DIR/fastdeploy-0.1.0.dist-info:
the built-in plugins, the `cuda` backend among them, are found through entry points, and without
them `device="cuda"` is "not a registered backend". The cuda backend needs no compiled extension.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDED = (
    "torch",
    "triton",
    "transformers",
    "pytest",
    "numpy",
    "safetensors",
    "tokenizers",
    "pluggy",
    "ml_dtypes",
    "gguf",
)


def run_step(name: str, command: list[str], out_dir: str, env: dict[str, str], timeout: int) -> dict:
    log = os.path.join(out_dir, f"{name}.txt")
    start = time.perf_counter()
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    with open(log, "w", encoding="utf-8") as handle:
        try:
            process = subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
            output, code = process.stdout, process.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = (exc.stdout or "") + f"\n[timed out after {timeout} s]", -1
        handle.write(output)
    tail = "\n".join(output.strip().splitlines()[-25:])
    print(tail, flush=True)
    return {
        "step": name,
        "returncode": code,
        "seconds": round(time.perf_counter() - start, 1),
        "log": log,
        "tail": tail,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check_out")
    parser.add_argument("--quick", action="store_true", help="SmolLM2 shape only")
    args = parser.parse_args()
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        print(f"missing modules: {', '.join(missing)} (pip install them; see README 'What has run where')")
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "0"  # tests/backends/conftest.py would turn the interpreter on
    shapes = "smollm2" if args.quick else "smollm2,1b"
    python = sys.executable
    steps = [
        ("env", [python, "-m", "fastdeploy", "env"], {}, 300),
        (
            "gpu_tests",
            [python, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider"],
            {"FD_GPU_TEST_SHAPES": shapes},
            5400,
        ),
        (
            "conformance_cuda",
            [python, "-m", "pytest", "-q", "tests/backends/test_conformance.py", "-p", "no:cacheprovider"],
            {"FD_CONFORMANCE_DEVICES": "cuda,torch-cpu"},
            1800,
        ),
        (
            "kernels",
            [python, "benchmarks/cuda_kernels.py", "--json", os.path.join(out_dir, "kernels.json")],
            {},
            1800,
        ),
        (
            "throughput",
            [
                python,
                "benchmarks/throughput.py",
                "--device",
                "cuda",
                "--shapes",
                shapes,
                "--quantizations",
                "wint8,wint4,fp8",
                "--json",
                os.path.join(out_dir, "throughput.json"),
            ],
            {},
            5400,
        ),
        (
            "accuracy",
            [python, "benchmarks/accuracy.py", "--device", "cuda", "--prompts", "8", "--tokens", "32"]
            + ["--json", os.path.join(out_dir, "accuracy.json")],
            {},
            1800,
        ),
        (
            "windows_sinks",
            [
                python,
                "-m",
                "pytest",
                "-q",
                "tests/models/test_gpt_oss.py::test_the_cuda_backends_code_runs_the_sinks_and_the_window[cuda-triton]",
                "tests/models/test_gemma2.py::test_the_cuda_backends_code_generates_transformers_tokens[cuda]",
                "-p",
                "no:cacheprovider",
            ],
            {},
            900,
        ),
        (
            "latent_attention",
            [
                python,
                "-m",
                "pytest",
                "-q",
                "tests/models/test_deepseek_v3.py::test_the_cuda_backends_code_gives_transformers_tokens",
                "tests/models/test_deepseek_mtp.py::test_mtp_on_the_cuda_backends_code_keeps_transformers_tokens",
                "-m",
                "gpu",
                "-p",
                "no:cacheprovider",
            ],
            {},
            900,
        ),
        (
            "decode_roofline",
            [python, "benchmarks/decode_roofline.py", "--shapes", shapes]
            + ["--json", os.path.join(out_dir, "decode_roofline.json")],
            {},
            1800,
        ),
    ]
    results = [
        run_step(name, command, out_dir, env | extra, timeout) for name, command, extra, timeout in steps
    ]
    print("\n=== summary")
    for result in results:
        state = "ok" if result["returncode"] == 0 else f"FAILED (exit {result['returncode']})"
        print(f"{result['step']:<18} {state:<18} {result['seconds']:8.1f} s   log: {result['log']}")
    kernels = os.path.join(out_dir, "kernels.json")
    if os.path.exists(kernels):
        with open(kernels, encoding="utf-8") as handle:
            for item in json.load(handle):
                verdict = "met" if item["meets_target"] else "NOT met"
                print(
                    f"  {item['kernel']:<62} {item['ratio']:6.2f}x of torch (target {item['target']}x: {verdict})"
                )
    throughput = os.path.join(out_dir, "throughput.json")
    if os.path.exists(throughput):
        with open(throughput, encoding="utf-8") as handle:
            for shape, figures in json.load(handle).items():
                ours, peer = figures["fastdeploy"], figures["transformers"] or {}
                line = ", ".join(
                    f"{key} {ours[key]:.0f} tok/s"
                    + (f" ({ours[key] / peer[key]:.1f}x)" if key in peer else "")
                    for key in ours
                )
                print(f"  {shape}: {line}")
    roofline = os.path.join(out_dir, "decode_roofline.json")
    if os.path.exists(roofline):
        with open(roofline, encoding="utf-8") as handle:
            report = json.load(handle)
        print(f"  decode roofline (bandwidth {report['bandwidth_gbs']:.0f} GB/s):")
        for shape, figures in report["shapes"].items():
            for graphs in ("graphs_on", "graphs_off"):
                line = ", ".join(
                    f"{name} {entry['tok_s']:.0f} tok/s = {entry['roofline']:.1%}"
                    for name, entry in figures[graphs].items()
                )
                print(f"    {shape} {graphs}: {line}")
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    return 0 if all(result["returncode"] == 0 for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
