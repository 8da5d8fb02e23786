"""`LoRARequest`: which adapter a request runs with (vLLM's and FastDeploy's shape)."""

from __future__ import annotations

from dataclasses import dataclass

from fastdeploy.errors import InvalidArgumentError


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, engine-wide integer id and path (a PEFT adapter directory, or a GGUF
    LoRA file written by llama.cpp's `convert_lora_to_gguf.py`).

    The id identifies the adapter: requests with the same id share its slot and its prefix-cache
    blocks, so one id must always name the same adapter.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidArgumentError(
                f"LoRARequest lora_name must be a non-empty str, got {self.lora_name!r}"
            )
        if (
            isinstance(self.lora_int_id, bool)
            or not isinstance(self.lora_int_id, int)
            or self.lora_int_id < 1
        ):
            raise InvalidArgumentError(
                f"LoRARequest lora_int_id must be an int >= 1, got {self.lora_int_id!r} (adapter {self.lora_name!r})"
            )
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidArgumentError(
                f"LoRARequest lora_path must name the adapter's directory or .gguf file (adapter {self.lora_name!r})"
            )

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path
