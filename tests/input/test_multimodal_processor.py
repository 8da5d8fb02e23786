"""ERNIE-4.5-VL's image and video processing against transformers' processors.

References: tests/fixtures/ernie4_5_vl_pixels.npz, written by tools/make_vl_references.py with
transformers' `Ernie4_5_VLMoeImageProcessorPil` (real photographs in tests/fixtures/images/, at
the default pixel bounds and at bounds that force a downscale and an upscale) and
`Ernie4_5_VLMoeVideoProcessor` (a clip cut from a photograph).
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from fastdeploy.input.multimodal.ernie4_5_vl import (  # noqa: E402
    Ernie4_5_VLProcessor,
    ProcessorSettings,
    VisionTokens,
)
from fastdeploy.input.multimodal.errors import MediaError  # noqa: E402
from fastdeploy.input.multimodal.image_processor import PatchSettings, preprocess_image, smart_resize  # noqa: E402
from fastdeploy.input.multimodal.inputs import MultiModalPrompt  # noqa: E402
from fastdeploy.input.multimodal.media import MediaPolicy, load_image, load_video  # noqa: E402
from fastdeploy.input.multimodal.parts import Media  # noqa: E402
from fastdeploy.input.multimodal.video_processor import FrameSampling, preprocess_video, sample_indices  # noqa: E402
from fastdeploy.input.processor import InputProcessor  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGES = FIXTURES / "images"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
BOUNDS = {"default": None, "small": (28 * 28 * 4, 28 * 28 * 20), "large": (28 * 28 * 40, 28 * 28 * 60)}
TOKENS = VisionTokens(image=152, image_start=150, image_end=151, video=155, video_start=153, video_end=154)


@pytest.fixture(scope="module")
def pixels() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "ernie4_5_vl_pixels.npz") as data:
        return dict(data)


def photo_names() -> list[str]:
    return sorted(path.name for path in IMAGES.iterdir())


def test_the_fixture_covers_every_photograph(pixels):
    names = {key.split("/")[0] for key in pixels if not key.startswith("video/")}
    assert {key.split("/")[1] for key in pixels if key.startswith("video/")} == set(CLIPS)
    assert names == set(photo_names()) and len(names) >= 5
    sizes = {Image.open(IMAGES / name).size for name in names}
    assert len(sizes) == len(names)  # several sizes and aspect ratios
    assert {Image.open(IMAGES / name).mode for name in names} >= {"RGB", "L"}


@pytest.mark.parametrize("label", sorted(BOUNDS))
@pytest.mark.parametrize("name", photo_names())
def test_image_pixel_values_equal_transformers(name, label, pixels):
    bounds = BOUNDS[label]
    settings = (
        PatchSettings() if bounds is None else PatchSettings(min_pixels=bounds[0], max_pixels=bounds[1])
    )
    patches, grid = preprocess_image(Image.open(IMAGES / name), settings)
    assert [list(grid)] == pixels[f"{name}/{label}/grid_thw"].tolist()
    np.testing.assert_allclose(patches, pixels[f"{name}/{label}/pixel_values"], atol=1e-6, rtol=0)


def test_image_forms_give_the_same_pixels(pixels):
    """PIL image, encoded bytes, a path, a data: URL and a numpy array are the same picture."""
    path = IMAGES / "chelsea_180x120.png"
    data = path.read_bytes()
    policy = MediaPolicy()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    forms = [Image.open(path), data, str(path), path, url, np.asarray(Image.open(path))]
    expected = pixels["chelsea_180x120.png/default/pixel_values"]
    for form in forms:
        patches, _ = preprocess_image(load_image(form, "image 0", policy), PatchSettings())
        np.testing.assert_allclose(patches, expected, atol=1e-6, rtol=0)


def test_smart_resize_keeps_multiples_of_28_within_bounds():
    # hand-computed: 30x30 rounds to 28x28 = 784 < 3136 pixels, so it is scaled up to 56x56;
    # 1000x2000 exceeds 78400 pixels: beta = sqrt(2e6 / 78400) = 5.05, floor(1000 / 5.05 / 28) = 7
    # and floor(2000 / 5.05 / 28) = 14 blocks of 28 -> 196x392; 2001x10 is refused (aspect > 200)
    assert smart_resize(30, 30, 28, 56 * 56, 10**7) == (56, 56)
    assert smart_resize(1000, 2000, 28, 56 * 56, 28 * 28 * 100) == (196, 392)
    with pytest.raises(MediaError, match="aspect ratio"):
        smart_resize(10, 2001, 28, 56 * 56, 10**7)


#: the clips of the fixture (tools/make_vl_references.py): frames cut from a photograph, kept at
#: their size (84x56) or resized by the processor (100x70 -> 112x56)
CLIPS = {"kept": (6, 84, 56, 9), "resized": (5, 100, 70, 20)}


def video_frames(label: str = "kept") -> list[np.ndarray]:
    count, width, height, step = CLIPS[label]
    photo = np.asarray(Image.open(IMAGES / "astronaut_211x130.jpg").convert("RGB"))
    return [photo[10 : 10 + height, i * step : i * step + width] for i in range(count)]


@pytest.mark.parametrize("label", sorted(CLIPS))
def test_video_pixel_values_equal_transformers(label, pixels):
    video, options = load_video(video_frames(label), "video 0", MediaPolicy())
    settings = PatchSettings(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 30)
    patches, grid = preprocess_video(video, settings, FrameSampling())
    assert [list(grid)] == pixels[f"video/{label}/grid_thw"].tolist()
    np.testing.assert_allclose(patches, pixels[f"video/{label}/pixel_values"], atol=1e-6, rtol=0)


def test_frame_sampling_follows_fps_and_max_frames():
    # transformers: kept = min(max(total / video_fps * fps, min_frames), max_frames, total)
    # 100 frames at 25 fps sampled at 2 fps -> 8 frames, every 12.5th
    assert sample_indices(100, 25.0, FrameSampling(fps=2, min_frames=4, max_frames=180)).tolist() == [
        0,
        12,
        25,
        37,
        50,
        62,
        75,
        87,
    ]
    assert sample_indices(100, 25.0, FrameSampling(max_frames=5, min_frames=1)).tolist() == [
        0,
        20,
        40,
        60,
        80,
    ]
    assert sample_indices(6, None, FrameSampling()).tolist() == [0, 1, 2, 3, 4, 5]


def test_encoded_video_is_decoded_with_pyav():
    av = pytest.importorskip("av")
    frames = video_frames()
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(
            "libx264rgb" if "libx264rgb" in av.codecs_available else "mpeg4", rate=10
        )
        stream.width, stream.height = 84, 56
        stream.pix_fmt = "rgb24" if stream.codec_context.name == "libx264rgb" else "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    video, options = load_video({"video": buffer.getvalue(), "max_frames": 4}, "video 0", MediaPolicy())
    assert video.frames.shape == (6, 56, 84, 3) and video.fps == pytest.approx(10.0)
    assert options == {"max_frames": 4}


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise AssertionError("token-id prompts are not re-encoded")


def processor() -> Ernie4_5_VLProcessor:
    return Ernie4_5_VLProcessor(FakeTokenizer(), TOKENS, ProcessorSettings())


def test_placeholders_expand_to_one_token_per_merged_patch_with_3d_positions():
    image = Image.open(IMAGES / "coffee_250x97.png")  # grid (1, 6, 18): 27 tokens
    prompt = processor().process([1, 7, 150, 152, 151, 9], [image])
    assert prompt.token_ids == [1, 7, 150] + [152] * 27 + [151, 9]
    item = prompt.items[0]
    assert (item.offset, item.length, item.grid_thw) == (3, 27, (1, 6, 18))
    # text 0..2; image at start 3: t=3, h=3+row (3 rows), w=3+col (9 columns); text resumes at 3+9
    assert prompt.positions[:, :3].tolist() == [[0, 1, 2]] * 3
    assert prompt.positions[:, 3].tolist() == [3, 3, 3]
    assert prompt.positions[:, 3 + 26].tolist() == [3, 5, 11]
    assert prompt.positions[:, 30:].T.tolist() == [[12, 12, 12], [13, 13, 13]]
    assert prompt.next_position == 14
    assert prompt.vision_mask.tolist() == [0, 0] + [1] * 29 + [0]


def test_placeholder_counts_are_enforced():
    image = Image.open(IMAGES / "camera_64x64_gray.png")
    with pytest.raises(MediaError, match="1 image placeholder"):
        processor().process([150, 152, 151], [image, image])


class CountingProcessor:
    """A plugin's processor that knows nothing of limit_mm_per_prompt."""

    calls = 0

    def process(self, token_ids, images, videos, mm_processor_kwargs=None, labels=None):
        self.calls += 1
        return MultiModalPrompt(list(token_ids), [], None, len(token_ids), None)


def test_the_engine_enforces_limit_mm_per_prompt_before_any_processor_runs():
    inputs = InputProcessor(
        None, vocab_size=100, max_model_len=64, limit_mm_per_prompt={"image": 1, "video": 0}
    )
    inputs.mm_processor = CountingProcessor()
    two_images = Media()
    for index in range(2):
        two_images.add("image", b"unread", f"image {index}")
    with pytest.raises(
        MediaError, match=r"2 image\(s\), more than limit_mm_per_prompt allows \('image': 1\)"
    ):
        inputs.process_media([1, 2], two_images)
    one_video = Media()
    one_video.add("video", b"unread", "video 0")
    with pytest.raises(MediaError, match=r"1 video\(s\).*\('video': 0\)"):
        inputs.process_media([1, 2], one_video)
    assert inputs.mm_processor.calls == 0
    one_image = Media()
    one_image.add("image", b"unread", "image 0")
    inputs.process_media([1, 2], one_image)
    assert inputs.mm_processor.calls == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"not an image at all", "not an image"),
        ("data:image/png;base64,%%%notbase64", "base64"),
        (b"GIF89a" + b"\x00" * 10, "not an image|truncated"),
        ("http://127.0.0.1:9/x.png", "turned off"),
        ("/no/such/file.png", "no such file"),
        (42, "must be a PIL image"),
    ],
)
def test_bad_images_fail_with_a_message_naming_the_part(value, message):
    policy = MediaPolicy(allow_fetch=False)
    with pytest.raises(MediaError, match=message) as info:
        load_image(value, "message 0 content part 1", policy)
    assert "message 0 content part 1" in str(info.value)


def test_decompression_bombs_are_refused_before_decoding():
    buffer = io.BytesIO()
    Image.new("L", (4000, 4000)).save(buffer, format="PNG")
    with pytest.raises(MediaError, match="decompression bomb"):
        load_image(buffer.getvalue(), "image 0", MediaPolicy(max_image_pixels=1_000_000))


def test_local_paths_obey_the_allowed_directory(tmp_path):
    inside = tmp_path / "ok.png"
    Image.new("RGB", (30, 30)).save(inside)
    policy = MediaPolicy(allow_local=str(tmp_path))
    assert load_image(str(inside), "image 0", policy).size == (30, 30)
    with pytest.raises(MediaError, match="outside the allowed"):
        load_image(str(IMAGES / "chelsea_180x120.png"), "image 0", policy)
    with pytest.raises(MediaError, match="not allowed"):
        load_image(str(inside), "image 0", MediaPolicy(allow_local=False))


def test_mm_processor_kwargs_are_checked_and_applied():
    settings = ProcessorSettings().updated({"image_max_pixels": 28 * 28 * 20, "video_max_frames": 8})
    assert settings.image.max_pixels == 28 * 28 * 20 and settings.sampling.max_frames == 8
    with pytest.raises(MediaError, match="unknown key"):
        ProcessorSettings().updated({"max_pixel": 5})
    with pytest.raises(MediaError, match="positive"):
        ProcessorSettings().updated({"image_min_pixels": -1})
