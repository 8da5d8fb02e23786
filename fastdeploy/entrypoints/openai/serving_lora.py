"""LoRA adapters in the server: the names requests pick them by (`model`), their entries in
`/v1/models`, and loading and unloading at run time (vLLM's `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter`, behind `--allow-runtime-lora-updating`)."""

from __future__ import annotations

import json
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel

from fastdeploy.entrypoints.openai.errors import OpenAIError, invalid_request
from fastdeploy.entrypoints.openai.serving import ServingContext, parse_body
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.lora import LoRARequest


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


def parse_lora_modules(values: list[str] | None) -> list[tuple[str, str]]:
    """`--lora-modules` entries, `name=path` or vLLM's JSON `{"name": ..., "path": ...}`, as (name, path)."""
    modules = []
    for value in values or ():
        if value.lstrip().startswith("{"):
            try:
                entry = json.loads(value)
                modules.append((str(entry["name"]), str(entry["path"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidArgumentError(
                    f"--lora-modules {value!r}: a JSON entry needs 'name' and 'path' ({exc})"
                ) from exc
            continue
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise InvalidArgumentError(f"--lora-modules {value!r}: expected name=path")
        modules.append((name, path))
    names = [name for name, _ in modules]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"--lora-modules names must be distinct, got {', '.join(names)}")
    return modules


class ServedAdapters:
    """The adapters this server serves by name, each with an id of its own."""

    def __init__(self, engine: Any, runtime_updates: bool = False) -> None:
        #: the engine whose `LoRAManager` checks an adapter before it is served (None: no LoRA)
        self._loras = engine.loras
        self.runtime_updates = runtime_updates
        self._by_name: dict[str, LoRARequest] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._loras is not None

    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str) -> LoRARequest | None:
        return self._by_name.get(name)

    def add(self, name: str, path: str) -> LoRARequest:
        """Serve the adapter at `path` as `name`, read and checked against the model first."""
        if self._loras is None:
            raise InvalidArgumentError("LoRA adapters need the server started with --enable-lora")
        with self._lock:
            if name in self._by_name:
                raise InvalidArgumentError(f"a LoRA adapter named {name!r} is already served")
            request = LoRARequest(name, self._next_id, path)
            self._next_id += 1
        self._loras.check(request)
        with self._lock:
            self._by_name[name] = request
        return request

    def remove(self, name: str) -> None:
        with self._lock:
            request = self._by_name.pop(name, None)
        if request is None:
            raise OpenAIError(
                404, f"no LoRA adapter named {name!r} is served", param="lora_name", code="not_found"
            )
        self._loras.remove(request.lora_int_id)

    def model_entries(self, parent: str, created: int, max_model_len: int) -> list[dict[str, Any]]:
        """`/v1/models` entries of the adapters, their base model as `parent`."""
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "fastdeploy",
                "root": request.lora_path,
                "parent": parent,
                "max_model_len": max_model_len,
            }
            for name, request in self._by_name.items()
        ]


def add_lora_routes(app: FastAPI, ctx: ServingContext, dependencies: list[Any]) -> None:
    """`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (only with runtime updates on)."""
    adapters: ServedAdapters = ctx.adapters
    if not adapters.runtime_updates:
        return

    @app.post("/v1/load_lora_adapter", dependencies=dependencies)
    async def load_lora_adapter(request: Request) -> Response:
        body = parse_body(LoadLoRAAdapterRequest, await request.body())
        try:
            await ctx.offload(adapters.add, body.lora_name, body.lora_path)
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param="lora_path") from exc
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", dependencies=dependencies)
    async def unload_lora_adapter(request: Request) -> Response:
        body = parse_body(UnloadLoRAAdapterRequest, await request.body())
        adapters.remove(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
