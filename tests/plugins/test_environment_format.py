"""`fastdeploy env`'s text columns stay aligned whatever the length of the names."""

from __future__ import annotations

from fastdeploy.cli.environment import BackendStatus, EnvironmentReport, format_environment
from fastdeploy.plugins.registry import PluginInfo


def report_with(backends: list[BackendStatus], plugins: list[PluginInfo]) -> str:
    report = EnvironmentReport(
        fastdeploy_version="0.1.0",
        python="3.11.7",
        platform="Linux",
        plugins=plugins,
        backends=backends,
        auto_device="cpu",
        components={
            "fastdeploy_model_architectures": {"A": "p", "AVeryLongArchitectureNameForCausalLM": "q"}
        },
    )
    return format_environment(report)


def test_long_device_and_plugin_names_keep_the_columns_aligned():
    text = report_with(
        [
            BackendStatus("cpu", "fastdeploy.cpu_backend", True, None, 0, "native kernels"),
            BackendStatus("my-vendor-accelerator", "vendor", False, "driver missing", 50),
        ],
        [
            PluginInfo("gpt2", "fastdeploy-gpt2", False, True),
            PluginInfo("a-plugin-with-a-name-longer-than-32-chars", "d", False, True),
        ],
    )
    lines = text.splitlines()
    cpu = next(line for line in lines if line.startswith("  cpu "))
    vendor = next(line for line in lines if line.startswith("  my-vendor-accelerator "))
    assert cpu.index("available") == vendor.index("unavailable") == len("  my-vendor-accelerator ")
    runs = next(line for line in lines if "runs:" in line)
    why = next(line for line in lines if "why:" in line)
    assert runs.index("runs:") == why.index("why:") == len("  my-vendor-accelerator ")
    gpt2 = next(line for line in lines if line.startswith("  gpt2 "))
    long = next(line for line in lines if line.startswith("  a-plugin-with"))
    assert (
        gpt2.index("third-party")
        == long.index("third-party")
        == len("  a-plugin-with-a-name-longer-than-32-chars ")
    )
    short_arch = next(line for line in lines if line.startswith("  A "))
    long_arch = next(line for line in lines if line.startswith("  AVeryLong"))
    assert (
        short_arch.index(" p") + 1
        == long_arch.index(" q") + 1
        == len("  AVeryLongArchitectureNameForCausalLM ")
    )


def test_short_names_keep_the_usual_widths():
    text = report_with([BackendStatus("cpu", "fastdeploy.cpu_backend", True, None, 0)], [])
    assert "  cpu        available   plugin fastdeploy.cpu_backend, auto priority 0" in text.splitlines()
