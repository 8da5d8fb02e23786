"""Engine-wide multimodal settings handed to processor factories (`fastdeploy_multimodal_processors`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.media_fetch import FetchPolicy
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.media import MediaPolicy

MODALITIES = ("image", "video")


@dataclass(frozen=True)
class ProcessorOptions:
    """`limit_mm_per_prompt`, `mm_processor_kwargs` (engine defaults) and where media may come from."""

    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    policy: MediaPolicy = MediaPolicy()


def check_limits(value: Any) -> dict[str, int]:
    """`limit_mm_per_prompt` as {modality: max count}; raises naming a bad key or value."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(
            f"limit_mm_per_prompt must be a dict like {{'image': 4}}, got {type(value).__name__}"
        )
    for key, count in value.items():
        if key not in MODALITIES:
            raise InvalidArgumentError(
                f"limit_mm_per_prompt: unknown modality {key!r}; use {', '.join(MODALITIES)}"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"limit_mm_per_prompt[{key!r}] must be an int >= 0, got {count!r}")
    return dict(value)


def enforce_limits(limits: Mapping[str, int], counts: Mapping[str, int]) -> None:
    """Refuse a request with more items of a modality than `limits` (checked `limit_mm_per_prompt`)
    allows; the engine does this before any processor sees the request."""
    for modality, count in counts.items():
        limit = limits.get(modality)
        if limit is not None and count > limit:
            raise MediaError(
                f"this request has {count} {modality}(s), more than limit_mm_per_prompt allows "
                f"({modality!r}: {limit})"
            )


def media_policy(config: Any) -> MediaPolicy:
    """Where an engine's requests may take media from (its `EngineConfig`'s media fields)."""
    domains = config.allowed_media_domains
    if domains is not None:
        if isinstance(domains, str) or not all(isinstance(d, str) and d.strip() for d in domains):
            raise InvalidArgumentError(
                f"allowed_media_domains must be a list of host names like ['a.com'], got {domains!r}"
            )
        domains = tuple(domains)
    fetch = FetchPolicy(
        allowed_domains=domains,
        allow_private_networks=bool(config.media_allow_private_networks),
        max_redirects=0 if config.media_url_no_redirects else FetchPolicy.max_redirects,
    )
    return MediaPolicy(
        allow_local=config.allowed_local_media_path, allow_fetch=config.allow_media_url_fetch, fetch=fetch
    )


def build_multimodal_processor(
    registry: Any,
    model: Any,
    tokenizer: Any,
    model_config: Any,
    config: Any,
    limits: dict[str, int],
    policy: MediaPolicy,
) -> Any:
    """The processor of a multimodal model (None for text-only models), from the plugin hook;
    `limits` is `config.limit_mm_per_prompt` as `check_limits` returned it, `policy` the
    engine's `media_policy(config)`."""
    if not getattr(model, "supports_multimodal", False):
        return None
    factories = registry.multimodal_processors()
    factory = factories.get(model_config.architecture)
    if factory is None:
        raise InvalidArgumentError(
            f"{model_config.architecture} takes images, but no plugin registers a multimodal processor for it "
            "(hook fastdeploy_multimodal_processors)"
        )
    options = ProcessorOptions(dict(limits), dict(config.mm_processor_kwargs or {}), policy)
    return factory(tokenizer, model_config, options)
