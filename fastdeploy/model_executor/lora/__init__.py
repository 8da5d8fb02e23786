"""LoRA adapters: the request type, reading adapters (PEFT directories, llama.cpp GGUF LoRA
files), and the slots of the resident ones (`LoRAManager`)."""

from fastdeploy.model_executor.lora.manager import LoRAManager
from fastdeploy.model_executor.lora.request import LoRARequest

__all__ = ["LoRAManager", "LoRARequest"]
