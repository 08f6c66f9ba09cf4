"""The family's prompt conventions for video clips (`models/qwen_vl/vision.py`), held to what
transformers does with the same frames: pixels in the video processors' temporal patch layout
(their `patchify`, written out here, over each frame as the checkpoint's image processor
prepares it), placeholders as the HF processor classes expand them (`replace_video_token`,
`get_text_with_replacements`), and a prefill of the clip equal to the model's own forward over
those inputs (positions and token types computed by the model)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    AutoImageProcessor,
    Cosmos3EdgeProcessor,
    Qwen2_5_VLProcessor,
    Qwen3VLProcessor,
)
from transformers.video_utils import VideoMetadata

from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.errors import InvalidRequest
from worldserve.models import registry

FPS = 2.0
PROCESSORS = {"plain": Qwen2_5_VLProcessor, "timestamped": Qwen3VLProcessor,
              "framewise": Cosmos3EdgeProcessor}
VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "cosmos3_omni", "cosmos3_edge"])
def loaded(request, tiny_dir, tmp_path_factory) -> tuple[Path, object]:
    if request.param == "qwen2_5_vl":
        model_dir = tiny_dir
    else:
        from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

        model_dir = tmp_path_factory.mktemp(request.param)
        write_reasoner_files(model_dir, 0, request.param)
    return model_dir, registry.load_runner("reasoner", model_dir)


def _frames(count: int) -> list[bytes]:
    return [frame_bytes(i, size=84) for i in range(count)]


def _unpatchify(patches: torch.Tensor, grid: torch.Tensor, image_processor) -> torch.Tensor:
    """An image processor's (N, D) patches of one image -> the (C, H, W) frame they hold."""
    p, m = image_processor.patch_size, image_processor.merge_size
    tp = image_processor.temporal_patch_size
    gh, gw = int(grid[1]), int(grid[2])
    if type(image_processor).__name__.startswith("Cosmos3Edge"):  # (.., ph, pw, C, tp)
        x = patches.view(gh // m, gw // m, m, m, p, p, -1, tp)[..., 0]
        return x.permute(6, 0, 2, 4, 1, 3, 5).reshape(x.shape[-1], gh * p, gw * p)
    x = patches.view(gh // m, gw // m, m, m, -1, tp, p, p)[:, :, :, :, :, 0]  # (.., C, ph, pw)
    return x.permute(4, 0, 2, 5, 1, 3, 6).reshape(x.shape[4], gh * p, gw * p)


def _video_patchify(frames: torch.Tensor, image_processor) -> torch.Tensor:
    """transformers' video `patchify` (Qwen2-VL; Cosmos3 Edge: HWC values within a patch) of
    (T, C, H, W) frames, the last frame repeated to fill the last temporal patch."""
    p, m = image_processor.patch_size, image_processor.merge_size
    tp = image_processor.temporal_patch_size
    if pad := -frames.shape[0] % tp:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    t, c, h, w = frames.shape
    x = frames.view(1, t // tp, tp, c, h // p // m, m, p, w // p // m, m, p)
    if type(image_processor).__name__.startswith("Cosmos3Edge"):
        x = x.permute(0, 1, 4, 7, 5, 8, 6, 9, 3, 2)
    else:
        x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(t // tp * (h // p) * (w // p), -1)


@pytest.mark.parametrize("count", [4, 5])
def test_clip_pixels_are_its_frames_in_the_video_patch_layout(loaded, count):
    model_dir, runner = loaded
    image_processor = AutoImageProcessor.from_pretrained(model_dir)
    frames = _frames(count)
    video = runner.prompting.read_video(frames, FPS)
    per_frame = [image_processor(images=[runner_image(data)], return_tensors="pt")
                 for data in frames]
    stacked = torch.stack([_unpatchify(out["pixel_values"], out["image_grid_thw"][0],
                                       image_processor) for out in per_frame])
    expected = _video_patchify(stacked, image_processor)
    tp = image_processor.temporal_patch_size
    grid = per_frame[0]["image_grid_thw"][0]
    assert video.kind == "video"
    assert video.payload.grid_thw.tolist() == [[-(-count // tp), int(grid[1]), int(grid[2])]]
    assert torch.equal(video.payload.pixel_values, expected)
    assert video.num_tokens == int(video.payload.grid_thw.prod()) // image_processor.merge_size ** 2


def runner_image(data: bytes):
    from worldserve.models.qwen_vl.vision import decode_image

    return decode_image(data)


def _hf_expansion(runner, text: str, video) -> list[int]:
    """What the checkpoint's HF processor class makes of `text` and the clip's grid: its own
    `replace_video_token` and `get_text_with_replacements`."""
    prompting = runner.prompting
    processor = object.__new__(PROCESSORS[prompting.video_style])
    image_processor = runner.image_processor
    processor.__dict__.update(
        image_token="<|image_pad|>", video_token="<|video_pad|>",
        vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
        image_processor=image_processor,
        video_processor=SimpleNamespace(merge_size=image_processor.merge_size,
                                        temporal_patch_size=image_processor.temporal_patch_size))
    num_frames = len(video.payload.timestamps) * image_processor.temporal_patch_size
    metadata = VideoMetadata(total_num_frames=num_frames, fps=FPS,
                             frames_indices=list(range(num_frames)))
    inputs = {"video_grid_thw": video.payload.grid_thw, "video_metadata": [metadata]}
    replacement = processor.replace_video_token(inputs, 0)
    expanded, _ = processor.get_text_with_replacements([text], videos_replacements=[replacement])
    return runner.tokenizer(expanded[0], add_special_tokens=False)["input_ids"]


def test_clip_placeholders_expand_as_the_hf_processor_does(loaded):
    _, runner = loaded
    for count in (4, 6):  # whole temporal patches: the HF processors' own frame indices
        video = runner.prompting.read_video(_frames(count), FPS)
        text = f"<|im_start|>user\n{VIDEO_PART}What happens?<|im_end|>\n<|im_start|>assistant\n"
        ids = runner.prompting.tokenize(text, [video])
        assert ids == _hf_expansion(runner, text, video)
        assert ids.count(runner.prompting.video_token_id) == video.num_tokens


def test_clip_prefill_equals_the_models_own_forward(loaded):
    """Logits of a prompt holding a clip, through the runner (its positions, its encoding of
    the clip), equal the model's forward given the pixels and the grid alone."""
    _, runner = loaded
    video = runner.prompting.read_video(_frames(4), FPS)
    text = f"<|im_start|>user\n{VIDEO_PART}Describe.<|im_end|>\n<|im_start|>assistant\n"
    ids = runner.prompting.tokenize(text, [video])
    got = runner.forward(runner.new_kv(), ids, [video], num_logits=len(ids))
    model = runner.model
    input_ids = torch.tensor([ids])
    extra = {}
    if model.config.model_type == "qwen2_5_vl":  # as Qwen2.5-VL's processor computes it
        extra["second_per_grid_ts"] = torch.tensor(
            [runner.image_processor.temporal_patch_size / FPS])
    with torch.inference_mode():
        expected = model(input_ids=input_ids, pixel_values_videos=video.payload.pixel_values,
                         video_grid_thw=video.payload.grid_thw,
                         mm_token_type_ids=(input_ids == model.config.video_token_id).long() * 2,
                         **extra).logits[0].float()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_images_and_clips_mix_in_one_prompt_and_bad_clips_are_400(loaded):
    _, runner = loaded
    prompting = runner.prompting
    image, video = prompting.read_image(frame_bytes(9)), prompting.read_video(_frames(2), FPS)
    text = f"<|vision_start|><|image_pad|><|vision_end|>then{VIDEO_PART}now"
    ids = prompting.tokenize(text, [image, video])
    assert ids.count(prompting.image_token_id) == image.num_tokens
    assert ids.count(prompting.video_token_id) == video.num_tokens
    with pytest.raises(InvalidRequest, match="vision placeholders"):
        prompting.tokenize(text, [video, image])
    with pytest.raises(InvalidRequest, match="same size"):
        prompting.read_video([frame_bytes(0, size=56), frame_bytes(1, size=84)], FPS)
    with pytest.raises(InvalidRequest, match="fps must be positive"):
        prompting.read_video(_frames(2), 0.0)
    with pytest.raises(InvalidRequest, match="invalid image"):
        prompting.read_video([b"not a frame"], FPS)


@pytest.mark.parametrize(("style", "version", "collapses"), [
    ("timestamped", "5.24.0", False), ("timestamped", "5.24.9", False),
    ("timestamped", "5.25.0", True), ("timestamped", "5.25.0.dev0", True),
    ("timestamped", "5.26.1", True), ("timestamped", "6.0.0", True),
    ("framewise", "5.0.0", True), ("plain", "5.25.0", False)])
def test_the_video_wrapper_collapses_from_transformers_5_25_for_timestamped_styles(
        style, version, collapses):
    """Each side of the version boundary, asked exactly: 5.25.0 is the first release whose
    Qwen3-VL processor collapses the template's outer video wrapper."""
    from worldserve.models.qwen_vl.vision import collapses_video_wrapper

    assert collapses_video_wrapper(style, version) is collapses


def test_a_timestamped_clip_keeps_or_drops_the_outer_wrapper_by_the_version_asked(tmp_path):
    """The same clip and prompt (Cosmos3 Omni), prompted for transformers 5.24 and 5.25: the
    later has exactly the template's outer `<|vision_start|>`/`<|vision_end|>` pair fewer, the
    spans unchanged."""
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
    from worldserve.models.qwen_vl.vision import QwenVLPrompting

    write_reasoner_files(tmp_path, 0, "cosmos3_omni")
    runner = registry.load_runner("reasoner", tmp_path)
    assert runner.prompting.video_style == "timestamped"
    video = runner.prompting.read_video(_frames(4), FPS)
    text = f"A{VIDEO_PART}B"
    old, new = (QwenVLPrompting(runner.tokenizer, runner.image_processor, "timestamped", v)
                .tokenize(text, [video]) for v in ("5.24.0", "5.25.0"))
    start, end = runner.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    a, b = runner.tokenizer("A", add_special_tokens=False)["input_ids"], \
        runner.tokenizer("B", add_special_tokens=False)["input_ids"]
    assert old == a + [start] + new[len(a):len(new) - len(b)] + [end] + b
