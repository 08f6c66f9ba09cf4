"""load_vlm and load_pipeline serve the dev checkpoints (and real-layout Qwen-VL directories)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from PIL import Image
from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

from worldserve.models.common import count_parameters
from worldserve.models.dev import build_dev_models
from worldserve.models.dev.tokenizer import build_tokenizer
from worldserve.models.qwen_vl.processor import VLProcessorShim, load_vlm
from worldserve.models.wan.loader import load_pipeline

USER_TURN = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hazard?"}]}]


@pytest.fixture(scope="module")
def dev_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dev-models")
    build_dev_models(root)
    return root


@pytest.fixture(scope="module")
def vlm(dev_root: Path):
    return load_vlm(dev_root / "reasoner", "float32", "cpu")


@pytest.fixture(scope="module")
def wan(dev_root: Path) -> WanPipeline:
    return load_pipeline(dev_root / "wan", "float32", "cpu")


def _frame(size: int = 224) -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_vlm_forward_with_image_and_greedy_token(vlm) -> None:
    model, processor = vlm
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    prompt = processor.apply_chat_template(USER_TURN, add_generation_prompt=True)
    batch = processor(text=[prompt], images=[_frame()], return_tensors="pt")
    image_token_id = model.config.image_token_id
    assert int((batch["input_ids"] == image_token_id).sum()) == 64  # 224x224 -> 16x16 / 2x2
    assert torch.equal(batch["mm_token_type_ids"], (batch["input_ids"] == image_token_id).long())
    with torch.inference_mode():
        logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    generated = model.generate(**batch, max_new_tokens=1, do_sample=False)
    assert generated.shape == (1, batch["input_ids"].shape[1] + 1)
    assert int(generated[0, -1]) == int(logits[0, -1].argmax())


def test_vlm_generation_config_stops_on_im_end(vlm) -> None:
    model, processor = vlm
    eos = processor.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == eos
    assert model.generation_config.pad_token_id == processor.tokenizer.pad_token_id


def test_shim_refuses_images_without_placeholders(dev_root: Path) -> None:
    processor = VLProcessorShim.from_pretrained(dev_root / "reasoner")
    with pytest.raises(ValueError, match="placeholder"):
        processor(text=["no placeholder here"], images=[_frame()])


def test_load_vlm_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_vlm(tmp_path / "Qwen/Qwen2.5-VL-3B-Instruct")


def _write_qwen3_vl_like_hub(directory: Path) -> None:
    """A tiny Qwen3-VL laid out like the hub repo: chat_template.json, Fast image processor."""
    tok = build_tokenizer()
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4,
            "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, rope_parameters=rope, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                           out_hidden_size=64, patch_size=16, num_position_embeddings=196,
                           deepstack_visual_indexes=[0]),
        tie_word_embeddings=True, image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    Qwen3VLForConditionalGeneration(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    (directory / "chat_template.jinja").unlink()
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": tok.chat_template}))
    Qwen2VLImageProcessorPil(patch_size=16).save_pretrained(directory)
    preprocessor = json.loads((directory / "preprocessor_config.json").read_text())
    preprocessor.update(image_processor_type="Qwen2VLImageProcessorFast",
                        processor_class="Qwen3VLProcessor",
                        size={"longest_edge": 256 * 256, "shortest_edge": 64 * 64})
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor))


def test_load_vlm_reads_a_qwen3_vl_hub_layout(tmp_path: Path) -> None:
    _write_qwen3_vl_like_hub(tmp_path)
    model, processor = load_vlm(tmp_path, torch.float32)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    prompt = processor.apply_chat_template(USER_TURN, add_generation_prompt=True)
    assert "<|image_pad|>" in prompt
    batch = processor(text=[prompt], images=[_frame()])
    assert batch["image_grid_thw"].tolist() == [[1, 14, 14]]  # patch 16: 224 / 16
    with torch.inference_mode():
        assert torch.isfinite(model(**batch).logits).all()


def _generate(pipe: WanPipeline, num_frames: int, seed: int) -> np.ndarray:
    return pipe(
        "a red car turns left",
        negative_prompt="",
        height=64,
        width=64,
        num_frames=num_frames,
        num_inference_steps=2,
        max_sequence_length=32,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    ).frames


@pytest.mark.parametrize("num_frames", [1, 9])
def test_wan_generates_seeded_images_and_videos(wan: WanPipeline, num_frames: int) -> None:
    frames = _generate(wan, num_frames, seed=7)
    assert frames.shape == (1, num_frames, 64, 64, 3)
    assert np.isfinite(frames).all()
    assert frames.min() >= 0.0 and frames.max() <= 1.0
    np.testing.assert_array_equal(_generate(wan, num_frames, seed=7), frames)
    assert not np.array_equal(_generate(wan, num_frames, seed=8), frames)


def test_load_pipeline_reloads_the_wan_pipeline(wan: WanPipeline) -> None:
    assert isinstance(wan, WanPipeline)
    assert wan.tokenizer.model_max_length == 512
    assert wan.vae.config.base_dim <= 8


def test_count_parameters_of_pipelines_and_modules(wan: WanPipeline) -> None:
    per_component = [count_parameters(m) for m in (wan.text_encoder, wan.transformer, wan.vae)]
    assert all(n > 0 for n in per_component)
    assert count_parameters(wan) == sum(per_component)
    with pytest.raises(TypeError):
        count_parameters("not a model")
