"""One real server process for the whole session (model load takes seconds), and clients for it."""

from __future__ import annotations

import openai
import pytest
from openai_server_helpers import ENGINE_ARGS, ServerProcess, free_port


@pytest.fixture(scope="session")
def server():
    """`python -m fastdeploy.entrypoints.openai.api_server` with no model: the embedded SmolLM2;
    it renders requests' own chat templates, so that their sandbox is tested."""
    process = ServerProcess(
        ["-m", "fastdeploy.entrypoints.openai.api_server", *ENGINE_ARGS, "--trust-request-chat-template"],
        free_port(),
    )
    yield process
    process.stop()


@pytest.fixture(scope="session")
def client(server):
    """The official openai package, pointed at the test server."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=120)
