"""Hugging Face Hub downloads through `huggingface_hub`, into its usual cache.

The repository's file list is read first (its model info), so only what the model needs is
downloaded (`choose_files`); `snapshot_download` then fetches it into the cache (`HF_HUB_CACHE`,
`HF_HOME`) with the hub's progress bar and a token from `HF_TOKEN` (or `hf auth login`): a file
whose connection drops resumes from the bytes it has, and the files a failed run finished are kept.
Under `HF_HUB_OFFLINE=1`, or when the hub cannot be reached, the cached snapshot of the revision is
used. Each failure becomes one line naming the id and what to do.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from fastdeploy import envs
from fastdeploy.errors import FastDeployError, InvalidArgumentError, ModelDownloadError, ModelNotFoundError
from fastdeploy.hub.files import choose_files
from fastdeploy.hub.messages import disk_full, first_line
from fastdeploy.hub.model_id import HubModelId
from fastdeploy.logger import get_logger
from fastdeploy.version import __version__

logger = get_logger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def fetch_from_huggingface(model: HubModelId, revision: str | None, gguf_file: str | None) -> tuple[str, str]:
    """The local snapshot of `model` at `revision` holding what it needs, and how to name that
    snapshot in errors."""
    endpoint = envs.hf_endpoint()
    host = endpoint or DEFAULT_ENDPOINT
    cache = envs.hf_hub_cache()
    cached = f"the cached copy of {model.repo_id}"
    if envs.hf_hub_offline():
        reason = "HF_HUB_OFFLINE=1 forbids downloading it: download it once online, or unset HF_HUB_OFFLINE"
        return cached_snapshot(model, revision, cache, reason), cached
    # imported on first use: huggingface_hub and its HTTP client take about half a second to import,
    # which only runs that resolve a hub id should pay
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    with _one_line_errors(model, revision, host, cache):
        try:
            # the model info lists every file, in one request that is not retried (an unreachable hub
            # falls back to the cache at once)
            api = HfApi(endpoint=endpoint, library_name="fastdeploy", library_version=__version__)
            info = api.model_info(model.repo_id, revision=revision)
        except (HfHubHTTPError, ValueError):
            raise
        except Exception as exc:  # the hub cannot be reached: its client raises its HTTP library's errors
            reason = f"{host} cannot be reached ({first_line(exc)}): check the network or HF_ENDPOINT"
            folder = cached_snapshot(model, revision, cache, reason)
            logger.warning("%s cannot be reached (%s); using the cached %s", host, first_line(exc), folder)
            return folder, cached
        where = f"{model.repo_id} (revision {revision or 'main'!r} on {host})"
        selection = choose_files([file.rfilename for file in info.siblings or []], model, gguf_file, where)
        logger.info("downloading %d files of %s from %s into %s", len(selection.files), model, host, cache)
        folder = snapshot_download(
            model.repo_id,
            revision=revision,
            allow_patterns=list(selection.files),
            cache_dir=cache,
            endpoint=endpoint,
            library_name="fastdeploy",
            library_version=__version__,
        )
    return folder, f"the downloaded copy of {model.repo_id}"


def cached_snapshot(model: HubModelId, revision: str | None, cache: str, reason: str) -> str:
    """The snapshot folder of `revision` (a branch, tag or commit) in the cache, which
    huggingface_hub lays out as models--ORG--NAME/{refs/REVISION, snapshots/COMMIT}; `reason`
    ends the error when there is none."""
    storage = os.path.join(cache, "models--" + model.repo_id.replace("/", "--"))
    name = revision or "main"
    commit = name if _COMMIT.match(name) else _read_ref(os.path.join(storage, "refs", name))
    folder = os.path.join(storage, "snapshots", commit) if commit else ""
    if not folder or not os.path.isdir(folder):
        raise ModelNotFoundError(
            f"{model} (revision {name!r}) is not in the Hugging Face cache {cache}, and {reason}"
        )
    return folder


def _read_ref(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


@contextmanager
def _one_line_errors(model: HubModelId, revision: str | None, host: str, cache: str) -> Iterator[None]:
    """huggingface_hub's exceptions (several lines each) as fastdeploy's one-line errors."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = revision or "main"
    try:
        yield
    except FastDeployError:
        raise
    except GatedRepoError:
        raise ModelDownloadError(
            f"{model.repo_id} on {host} is gated (HTTP 401/403): accept its conditions on its page, "
            "then set HF_TOKEN to an access token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{host} has no model repository {model.repo_id!r} (HTTP 404; a private one needs HF_TOKEN); "
            "check the id"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(
            f"{model.repo_id} on {host} has no revision {name!r}: pass an existing branch, tag or commit "
            "as revision= (--revision)"
        ) from None
    except LocalEntryNotFoundError as exc:
        raise ModelDownloadError(
            f"cannot download {model} from {host} ({first_line(exc)}): check the network or HF_ENDPOINT"
        ) from None
    except EntryNotFoundError as exc:
        raise ModelNotFoundError(
            f"a file of {model.repo_id} (revision {name!r}) is missing on {host} ({first_line(exc)}, "
            "HTTP 404): run again, or pin revision= to a commit"
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            raise ModelDownloadError(
                f"{host} refused {model.repo_id} (HTTP {status}): set HF_TOKEN to an access token that may read it"
            ) from None
        raise ModelDownloadError(
            f"downloading {model} from {host} failed (HTTP {status}): run again to resume"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ModelDownloadError(disk_full(model, cache)) from None
        raise ModelDownloadError(
            f"downloading {model} into {cache} failed ({first_line(exc)}): run again to resume"
        ) from None
    except ValueError as exc:
        raise InvalidArgumentError(f"{model} cannot be downloaded from {host}: {first_line(exc)}") from None
    except Exception as exc:  # the HTTP library's connection errors
        raise ModelDownloadError(
            f"downloading {model} from {host} failed ({type(exc).__name__}: {first_line(exc)}): check the "
            "network and run again to resume, or set HF_HUB_OFFLINE=1 to use the cache"
        ) from None
