"""A stand-in for `fastdeploy serve` (no model): answers the OpenAI routes the router forwards, and
can be told, by the prompt, to stop at a chosen point so a test can kill it exactly there.

Prompts naming this worker (`@NAME`) make it stop at a point:
- "hold-before-answer@NAME": accept the request and never answer
- "hold-after-headers@NAME": send the stream's headers, then nothing
- "hold-after-first@NAME": stream one chunk, then wait forever
- "fail-prefill@NAME": answer 504, as a prefill instance whose KV transfer stalled
- "step@NAME": stream each chunk after the previous one only once POST /release allows it
Anything else is answered at once; a stream has `chunks` chunks (default 3).

With --role prefill|decode it answers /v1/disaggregation as such an instance would (its KV layout
from --model and --block-size, KV port 5999), for the router's pairing.

GET /state reports what it saw: requests, streams open now, Authorization headers, held requests,
releases; POST /health/{ok|fail} makes /health answer 200 or 503; POST /release lets a "step@"
stream send its next chunk.
Run: python standin_worker.py --name NAME --host H --port P [--role R --model M --block-size B]
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse


def build_app(name: str, role: str = "mixed", model: str = "standin", block_size: int = 16) -> FastAPI:
    app = FastAPI()
    state = {
        "healthy": True,
        "requests": 0,
        "open_streams": 0,
        "held": 0,
        "authorization": [],
        "paths": [],
        "bodies": [],
        "released": 0,
    }
    forever = asyncio.Event()  # never set: what a held request waits on
    releases: asyncio.Queue[None] = asyncio.Queue()  # one item per POST /release

    @app.get("/health")
    async def health():
        return JSONResponse({"healthy": state["healthy"]}, 200 if state["healthy"] else 503)

    @app.post("/health/{verdict}")
    async def set_health(verdict: str):
        state["healthy"] = verdict == "ok"
        return {"healthy": state["healthy"]}

    @app.post("/release")
    async def release():
        state["released"] += 1
        releases.put_nowait(None)
        return {"released": state["released"]}

    @app.get("/state")
    async def get_state():
        return state

    @app.get("/v1/disaggregation")
    async def disaggregation():
        if role == "mixed":
            return {"role": role}
        layout = {
            "model": model,
            "dtype": "float32",
            "block_size": block_size,
            "num_layers": 2,
            "num_kv_heads": 2,
            "head_dim": 8,
            "layout": "blocks-slots-heads-dim",
        }
        return {"role": role, "kv_transport": "zmq", "kv_port": 5999, "kv_layout": layout}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": "shared-model", "object": "model"}, {"id": f"model-{name}"}],
        }

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            "# HELP standin:requests_total Requests seen\n# TYPE standin:requests_total counter\n"
            f"standin:requests_total {state['requests']}\n"
        )

    async def answer(request: Request, path: str):
        body = await request.json()
        state["requests"] += 1
        state["paths"].append(path)
        state["authorization"].append(request.headers.get("authorization"))
        state["bodies"].append(body)
        prompt = body.get("prompt") or json.dumps(body.get("messages"))
        if f"fail-prefill@{name}" in prompt:
            return JSONResponse({"error": {"message": "KV transfer failed: stalled", "code": 504}}, 504)
        if f"hold-before-answer@{name}" in prompt:
            state["held"] += 1
            await forever.wait()
        if not body.get("stream"):
            return JSONResponse({"object": "text_completion", "worker": name, "choices": [{"text": name}]})
        return StreamingResponse(stream(prompt, int(body.get("chunks", 3))), media_type="text/event-stream")

    async def stream(prompt: str, chunks: int):
        state["open_streams"] += 1
        try:
            if f"hold-after-headers@{name}" in prompt:
                state["held"] += 1
                yield b""
                await forever.wait()
            for index in range(chunks):
                yield f"data: {json.dumps({'worker': name, 'index': index, 'choices': [{'text': str(index)}]})}\n\n"
                if f"hold-after-first@{name}" in prompt:
                    state["held"] += 1
                    await forever.wait()
                if f"step@{name}" in prompt:
                    await releases.get()
                await asyncio.sleep(0)
            yield "data: [DONE]\n\n"
        finally:
            state["open_streams"] -= 1

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(request, "/v1/chat/completions")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvicorn-log-level", default="warning")
    parser.add_argument("--role", default="mixed", choices=["mixed", "prefill", "decode"])
    parser.add_argument("--model", default="standin")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    app = build_app(args.name, args.role, args.model, args.block_size)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level)


if __name__ == "__main__":
    main()
