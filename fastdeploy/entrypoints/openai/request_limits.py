"""Bounds on the request fields whose cost grows with their size, checked before any work.

Stop strings, stop token ids and bad words are checked against every generated token on the
engine thread, which serves every request in the batch: a 1 MB request with 100,000 stop strings
made a bystander's 16-token completion take 12 s instead of 0.8 s (each token scanned every stop
string). `n` multiplies a request into that many sequences. The bounds are far above what
sampling needs (OpenAI's API allows 4 stop strings and n up to 128), and a request beyond one
gets a 400 naming the field and the bound, never a slow server.
"""

from __future__ import annotations

from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.protocol import SamplingRequest

#: most samples one request may ask for (OpenAI's bound for `n`)
MAX_N = 128
#: most stop strings, and the longest one, in characters
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
#: most stop token ids
MAX_STOP_TOKEN_IDS = 256
#: most bad words
MAX_BAD_WORDS = 128


def check_request_limits(request: SamplingRequest) -> None:
    """Raise a 400 naming the first field of `request` that is over its bound."""
    if request.n > MAX_N:
        raise invalid_request(f"n={request.n} is too large: at most {MAX_N} samples per request", param="n")
    stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
    _check_count("stop", "stop strings", len(stops), MAX_STOP_STRINGS)
    longest = max((len(stop) for stop in stops), default=0)
    if longest > MAX_STOP_LENGTH:
        raise invalid_request(
            f"a stop string of {longest} characters is too long: at most {MAX_STOP_LENGTH}", param="stop"
        )
    _check_count("stop_token_ids", "stop token ids", len(request.stop_token_ids or []), MAX_STOP_TOKEN_IDS)
    _check_count("bad_words", "bad words", len(request.bad_words or []), MAX_BAD_WORDS)


def _check_count(param: str, what: str, count: int, bound: int) -> None:
    if count > bound:
        raise invalid_request(f"{count} {what} are too many: at most {bound}", param=param)
