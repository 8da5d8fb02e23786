"""Videos to vision-encoder patches: decode (PyAV), sample frames, resize, normalise, patchify.

Frame sampling follows transformers' `Ernie4_5_VLMoeVideoProcessor`: with `fps` the clip keeps
`total / video_fps * fps` frames, else all of them, clamped to [min_frames, max_frames] and to
the frames the video has, taken at indices `int(i * total / kept)`; an odd count repeats the
last frame, because the resampler merges frames in pairs. Frames are resized to
`smart_resize`'s size for the video pixel bounds with the antialiased bicubic filter rounded as
torch's uint8 kernel rounds it (`resample.py`; transformers resizes frames with torchvision), and
patchified frame by frame, so a video of T frames has grid (T, h, w) and T/2 * h/2 * w/2
placeholder tokens.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np

from fastdeploy.input.multimodal.errors import MediaError, require_av
from fastdeploy.input.multimodal.image_processor import (
    PatchSettings,
    normalized_chw,
    patchify,
    smart_resize,
)
from fastdeploy.input.multimodal.resample import resize_uint8


@dataclass(frozen=True)
class FrameSampling:
    """Which frames of a video are kept (per-video options and `mm_processor_kwargs` set these)."""

    fps: float | None = None
    min_frames: int = 16
    max_frames: int = 180


@dataclass
class DecodedVideo:
    """RGB frames [T, H, W, 3] uint8 and the frame rate (None when unknown, e.g. a frame list)."""

    frames: np.ndarray
    fps: float | None


def decode_video(data: bytes | str, what: str) -> DecodedVideo:
    """All frames of an encoded video (bytes or a file path) as RGB, with its average frame rate."""
    av = require_av()
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else os.fspath(data)
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise MediaError(f"{what}: the file has no video stream")
            stream = container.streams.video[0]
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
            rate = stream.average_rate
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"{what}: cannot decode the video: {exc}") from exc
    if not frames:
        raise MediaError(f"{what}: the video has no frames")
    return DecodedVideo(np.stack(frames), float(rate) if rate else None)


def sample_indices(total: int, video_fps: float | None, sampling: FrameSampling) -> np.ndarray:
    """Indices of the kept frames, as transformers' video processor picks them."""
    wanted = total / video_fps * sampling.fps if sampling.fps is not None and video_fps else total
    kept = min(max(wanted, sampling.min_frames), sampling.max_frames, total)
    return np.arange(0, total, total / kept).astype(np.int64)


def preprocess_video(
    video: DecodedVideo, settings: PatchSettings, sampling: FrameSampling
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches [T*h*w, 588] float32, grid (T, h, w)) of a decoded video."""
    frames = video.frames[sample_indices(len(video.frames), video.fps, sampling)]
    if len(frames) % 2:
        frames = np.concatenate([frames, frames[-1:]])
    height, width = frames.shape[1:3]
    new_height, new_width = smart_resize(
        height, width, settings.factor, settings.min_pixels, settings.max_pixels
    )
    resized = resize_uint8(frames, new_height, new_width)
    pixels = np.stack([normalized_chw(frame.transpose(2, 0, 1)) for frame in resized])
    grid = (len(frames), new_height // settings.patch_size, new_width // settings.patch_size)
    return patchify(pixels, settings), grid
