"""ERNIE-4.5-VL's multimodal processor: images and videos in, expanded prompt and encoder inputs out.

A prompt marks where each image or video goes with one placeholder, inside the start/end tokens
the chat template writes (`Picture 1:<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>`).
FastDeploy's placeholders `<|image@placeholder|>` / `<|video@placeholder|>` and the tokenizer's
own `<|IMAGE_PLACEHOLDER|>` / `<|VIDEO_PLACEHOLDER|>` are all accepted in text prompts; token-id
prompts mark items with runs of the placeholder id. Each placeholder becomes one token per
encoder output row: h*w/4 for an image of grid (1, h, w), T/2 * h*w/4 for a video (2x2 spatial
and 2-frame temporal merge), as transformers' `Ernie4_5_VLMoeProcessor` expands them.

Rotary positions are transformers' `get_rope_index`: text tokens count up on all three axes; an
image's tokens sit at (start, start + row, start + column) on (time, height, width), a video's
at (start + frame pair, ...), and the text after an item resumes at start + max(h, w)/2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.image_processor import PatchSettings, preprocess_image
from fastdeploy.input.multimodal.inputs import MultiModalItem, MultiModalPrompt
from fastdeploy.input.multimodal.media import MediaPolicy, load_image, load_video
from fastdeploy.input.multimodal.video_processor import FrameSampling, preprocess_video

IMAGE_PLACEHOLDERS = ("<|image@placeholder|>", "<|IMAGE_PLACEHOLDER|>")
VIDEO_PLACEHOLDERS = ("<|video@placeholder|>", "<|VIDEO_PLACEHOLDER|>")

#: `mm_processor_kwargs` this processor understands (FastDeploy's names)
PROCESSOR_KWARGS = (
    "image_min_pixels",
    "image_max_pixels",
    "video_min_pixels",
    "video_max_pixels",
    "video_fps",
    "video_min_frames",
    "video_max_frames",
)


@dataclasses.dataclass(frozen=True)
class ProcessorSettings:
    """Pixel bounds and frame sampling, the defaults of transformers' processors."""

    image: PatchSettings = PatchSettings()
    video: PatchSettings = PatchSettings(min_pixels=299 * 28 * 28, max_pixels=1196 * 28 * 28)
    sampling: FrameSampling = FrameSampling()

    def updated(
        self, kwargs: Mapping[str, Any] | None, what: str = "mm_processor_kwargs"
    ) -> ProcessorSettings:
        """These settings with `mm_processor_kwargs` applied; unknown or bad keys raise naming them."""
        if not kwargs:
            return self
        if not isinstance(kwargs, Mapping):
            raise MediaError(f"{what} must be a dict, got {type(kwargs).__name__}")
        unknown = sorted(set(kwargs) - set(PROCESSOR_KWARGS))
        if unknown:
            raise MediaError(
                f"{what}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(PROCESSOR_KWARGS)}"
            )
        for key, value in kwargs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise MediaError(f"{what}: {key} must be a positive number, got {value!r}")
        image, video, sampling = self.image, self.video, self.sampling
        image = dataclasses.replace(
            image,
            min_pixels=int(kwargs.get("image_min_pixels", image.min_pixels)),
            max_pixels=int(kwargs.get("image_max_pixels", image.max_pixels)),
        )
        video = dataclasses.replace(
            video,
            min_pixels=int(kwargs.get("video_min_pixels", video.min_pixels)),
            max_pixels=int(kwargs.get("video_max_pixels", video.max_pixels)),
        )
        sampling = dataclasses.replace(
            sampling,
            fps=float(kwargs["video_fps"]) if "video_fps" in kwargs else sampling.fps,
            min_frames=int(kwargs.get("video_min_frames", sampling.min_frames)),
            max_frames=int(kwargs.get("video_max_frames", sampling.max_frames)),
        )
        for bounds, name in ((image, "image"), (video, "video")):
            if bounds.min_pixels > bounds.max_pixels:
                raise MediaError(f"{what}: {name}_min_pixels must not exceed {name}_max_pixels")
        return ProcessorSettings(image, video, sampling)


@dataclasses.dataclass(frozen=True)
class VisionTokens:
    """The special token ids of a checkpoint (config.json, else the tokenizer's vocabulary)."""

    image: int
    image_start: int
    image_end: int
    video: int
    video_start: int
    video_end: int

    @property
    def placeholders(self) -> frozenset[int]:
        return frozenset((self.image, self.video))

    @property
    def vision(self) -> frozenset[int]:
        """Tokens the MoE layers route to the vision experts."""
        return frozenset(
            (self.image, self.video, self.image_start, self.image_end, self.video_start, self.video_end)
        )


def vision_positions(start: int, grid: tuple[int, int, int], temporal_merge: int) -> np.ndarray:
    """[3, tokens] positions of one item's tokens after merging (transformers' get_vision_position_ids)."""
    t, h, w = grid[0] // temporal_merge, grid[1] // 2, grid[2] // 2
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]).astype(np.int64) + start


class Ernie4_5_VLProcessor:
    """Built once per engine; `process` is called per request (never shares state between them)."""

    def __init__(
        self,
        tokenizer: Any,
        tokens: VisionTokens,
        settings: ProcessorSettings,
        policy: MediaPolicy | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.settings = settings
        self.policy = policy or MediaPolicy()

    # --- prompt text ---------------------------------------------------------------------------
    def placeholder_text(self, modality: str) -> str:
        """The token string one placeholder of `modality` is normalised to before encoding."""
        token = self.tokens.image if modality == "image" else self.tokens.video
        text = self.tokenizer.id_to_token(token)
        if text is None:
            raise MediaError(f"the tokenizer has no token for the {modality} placeholder id {token}")
        return text

    def encode_text(self, text: str) -> list[int]:
        """Prompt text with its placeholders normalised to the placeholder tokens, encoded."""
        for modality, spellings in (("image", IMAGE_PLACEHOLDERS), ("video", VIDEO_PLACEHOLDERS)):
            token = self.placeholder_text(modality)
            for spelling in spellings:
                text = text.replace(spelling, token)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # --- the whole request ---------------------------------------------------------------------
    def process(
        self,
        token_ids: Sequence[int],
        images: Sequence[Any] = (),
        videos: Sequence[Any] = (),
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        policy: MediaPolicy | None = None,
        labels: Mapping[str, Sequence[str]] | None = None,
    ) -> MultiModalPrompt:
        """Expand the placeholders of `token_ids` for `images` and `videos` (in prompt order).

        `labels` name each item in error messages (e.g. "message 0 content part 1"); by default
        "image N" / "video N".
        """
        settings = self.settings.updated(mm_processor_kwargs)
        policy = policy or self.policy
        runs = self._placeholder_runs(list(token_ids))
        found = {m: sum(1 for r in runs if r[0] == m) for m in ("image", "video")}
        for modality, given in (("image", len(images)), ("video", len(videos))):
            if found[modality] != given:
                raise MediaError(
                    f"the prompt has {found[modality]} {modality} placeholder(s) but {given} {modality}(s) "
                    "were given"
                )
        names = labels or {}

        def label(modality: str, index: int) -> str:
            given = names.get(modality) or []
            return given[index] if index < len(given) else f"{modality} {index}"

        encoded = {
            "image": [
                self._image(value, label("image", i), settings, policy) for i, value in enumerate(images)
            ],
            "video": [
                self._video(value, label("video", i), settings, policy) for i, value in enumerate(videos)
            ],
        }
        return self._expand(list(token_ids), runs, encoded)

    def _image(self, value: Any, what: str, settings: ProcessorSettings, policy: MediaPolicy) -> tuple:
        patches, grid = preprocess_image(load_image(value, what, policy), settings.image)
        return patches, grid

    def _video(self, value: Any, what: str, settings: ProcessorSettings, policy: MediaPolicy) -> tuple:
        video, options = load_video(value, what, policy)
        sampling = dataclasses.replace(settings.sampling, **options)
        return preprocess_video(video, settings.video, sampling)

    def _placeholder_runs(self, ids: list[int]) -> list[tuple[str, int, int]]:
        """(modality, start, end) of each maximal run of placeholder ids."""
        runs = []
        index = 0
        tokens = self.tokens
        while index < len(ids):
            if ids[index] not in tokens.placeholders:
                index += 1
                continue
            end = index
            while end < len(ids) and ids[end] == ids[index]:
                end += 1
            after_video_start = index > 0 and ids[index - 1] == tokens.video_start
            is_video = ids[index] == tokens.video if tokens.video != tokens.image else after_video_start
            runs.append(("video" if is_video else "image", index, end))
            index = end
        return runs

    def _expand(
        self, ids: list[int], runs: list[tuple[str, int, int]], encoded: dict[str, list[tuple]]
    ) -> MultiModalPrompt:
        out: list[int] = []
        positions: list[np.ndarray] = []
        items: list[MultiModalItem] = []
        next_of = {"image": iter(encoded["image"]), "video": iter(encoded["video"])}
        position = 0
        cursor = 0
        for modality, start, end in runs:
            text = ids[cursor:start]
            out.extend(text)
            positions.append(np.broadcast_to(np.arange(position, position + len(text)), (3, len(text))))
            position += len(text)
            patches, grid = next(next_of[modality])
            temporal = 2 if modality == "video" else 1
            length = grid[0] * grid[1] * grid[2] // 4 // temporal
            token = self.tokens.image if modality == "image" else self.tokens.video
            items.append(MultiModalItem(modality, patches, grid, offset=len(out), length=length))
            out.extend([token] * length)
            positions.append(vision_positions(position, grid, temporal))
            position += max(grid[1], grid[2]) // 2
            cursor = end
        tail = ids[cursor:]
        out.extend(tail)
        positions.append(np.broadcast_to(np.arange(position, position + len(tail)), (3, len(tail))))
        all_positions = np.concatenate(positions, axis=1).astype(np.int64)
        vision = np.isin(np.asarray(out, dtype=np.int64), list(self.tokens.vision)).astype(np.int8)
        return MultiModalPrompt(
            token_ids=out,
            items=items,
            positions=all_positions,
            next_position=int(all_positions.max()) + 1 if all_positions.size else 0,
            vision_mask=vision,
        )


def _token_id(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def vision_tokens(tokenizer: Any, config: Mapping[str, Any]) -> VisionTokens:
    """Special ids from config.json (-PT names, or -Paddle's `im_patch_id`), else the tokenizer."""

    def resolve(key: str, spelling: str, fallback: int | None = None) -> int:
        value = config.get(key)
        if value is None:
            value = _token_id(tokenizer, spelling)
        if value is None:
            value = fallback
        if value is None:
            raise MediaError(
                f"cannot find the {spelling} token: config.json has no {key} and the tokenizer lacks it"
            )
        return int(value)

    image = resolve("image_token_id", "<|IMAGE_PLACEHOLDER|>")
    return VisionTokens(
        image=image,
        image_start=resolve("image_start_token_id", "<|IMAGE_START|>"),
        image_end=resolve("image_end_token_id", "<|IMAGE_END|>"),
        # -Paddle checkpoints write video frames with the image placeholder
        video=resolve("video_token_id", "<|VIDEO_PLACEHOLDER|>", image),
        video_start=resolve("video_start_token_id", "<|VIDEO_START|>"),
        video_end=resolve("video_end_token_id", "<|VIDEO_END|>"),
    )


def build_processor(tokenizer: Any, model_config: Any, options: Any) -> Ernie4_5_VLProcessor:
    """The `fastdeploy_multimodal_processors` factory of ERNIE-4.5-VL."""
    raw = model_config.raw
    vision = raw.get("vision_config", {})
    defaults = ProcessorSettings()
    patch = {
        "patch_size": int(vision.get("patch_size", 14)),
        "merge_size": int(vision.get("spatial_merge_size", 2)),
    }
    settings = ProcessorSettings(
        dataclasses.replace(defaults.image, **patch),
        dataclasses.replace(defaults.video, **patch),
        defaults.sampling,
    ).updated(options.mm_processor_kwargs)
    return Ernie4_5_VLProcessor(tokenizer, vision_tokens(tokenizer, raw), settings, options.policy)
