"""Model calls: vision encoding, chunk positions (M-RoPE) and forwards over a KVState.

Loading goes through `processor.load_vlm` (the official processor where it can be built, else
the Pil image-processor shim). `QwenVLRunner` satisfies the reasoner's runner contract
(engines/reasoner/contract.py): its prompt conventions are `vision.QwenVLPrompting`, its batched
forwards `batch.py`, its static decode step `decode.py`. Logits stay on the model's device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from worldserve.models.common import count_parameters
from worldserve.models.qwen_vl import batch
from worldserve.models.qwen_vl.decode import StaticDecoder
from worldserve.models.qwen_vl.graphs import StepGraphs
from worldserve.models.qwen_vl.kv import KVState, PackedBatch
from worldserve.models.qwen_vl.processor import load_vlm
from worldserve.models.qwen_vl.vision import QwenVLPrompting, VideoStyle
from worldserve.models.types import ModelLoadError, VisionInput

# How each model type's processor writes a video into the prompt (vision.VideoStyle).
VIDEO_STYLES: dict[str, VideoStyle] = {"qwen2_vl": "plain", "qwen2_5_vl": "plain",
                                       "qwen3_vl": "timestamped"}


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> QwenVLRunner:
    """The registry's reasoner loader for a Qwen-VL checkpoint directory."""
    try:
        model, processor = load_vlm(model_dir, dtype=dtype, device=device)
        return QwenVLRunner(model, processor, VIDEO_STYLES.get(model.config.model_type, "plain"))
    except Exception as exc:
        raise ModelLoadError(f"cannot load a vision-language model from {model_dir}: "
                             f"{exc}") from exc


class QwenVLRunner:
    """Wraps a Qwen-VL `...ForConditionalGeneration`; every call runs under inference mode."""

    def __init__(self, model: Any, processor: Any, video_style: VideoStyle = "plain") -> None:
        tokenizer = processor.tokenizer
        template = getattr(processor, "chat_template", None) or tokenizer.chat_template
        if not template:
            raise ValueError("the checkpoint has no chat template (chat_template.jinja/json or "
                             "in the tokenizer config)")
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = processor.image_processor
        self.chat_template = template
        self.prompting = QwenVLPrompting(tokenizer, processor.image_processor, video_style)
        self.num_params = count_parameters(model)
        self.device = next(model.parameters()).device
        text_config = getattr(model.config, "text_config", model.config)
        self.vocab_size = int(text_config.vocab_size)
        self.max_position_embeddings = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self.num_forwards = 0
        self.num_packs = 0  # batched-decode caches packed so far (stats, tests)
        self.last_batch_rows: list[int] = []  # batch row of each sequence, last batched forward
        self.packed: PackedBatch | None = None
        self.static: StaticDecoder | None = None  # the static decode step, when configured

    def configure_decode(self, static: bool, compile_step: bool = False,
                         graphs: bool = False) -> str:
        """Choose the decode path: the static decode step (`decode.StaticDecoder`) when `static`
        and the architecture is one it knows, else transformers' forward; `graphs`: its steps
        captured and replayed (`graphs.StepGraphs`). Returns the path."""
        captured = StepGraphs.for_device(self.device) if graphs else None
        self.static = StaticDecoder.build(self.model, compile_step, captured) if static else None
        if self.static is None:
            return "eager"
        return "static, graphs" if captured is not None else "static"

    def new_kv(self) -> KVState:
        """An empty cache for one sequence (a session or a chat request)."""
        return KVState(self.model.config)

    def forward_decode_batch(self, kvs: list[KVState], fed: list[list[int]]) -> list[torch.Tensor]:
        """One decode step of several sequences in one forward (`batch.forward_decode_batch`)."""
        return batch.forward_decode_batch(self, kvs, fed)

    def forward_prefill_batch(self, kvs: list[KVState], ids: list[list[int]],
                              media: list[list[VisionInput]]) -> list[torch.Tensor]:
        """One chunk per sequence prefilled in one forward (`batch.forward_prefill_batch`)."""
        return batch.forward_prefill_batch(self, kvs, ids, media)

    @torch.inference_mode()
    def encode(self, media: list[VisionInput]) -> dict[str, Any]:
        """Vision tower outputs of `media` by kind, each kind in the order given (a session
        keeps a frame's for re-prefill)."""
        out: dict[str, Any] = {}
        images = [m for m in media if m.kind == "image"]
        videos = [m for m in media if m.kind == "video"]
        inner = self.model.model
        if images:
            out["image"] = inner.get_image_features(
                _pixels(images, self.device), grids(images).to(self.device), return_dict=True)
        if videos:
            out["video"] = inner.get_video_features(
                _pixels(videos, self.device), grids(videos).to(self.device), return_dict=True)
        return out

    def chunk_positions(self, ids: torch.Tensor, media: list[VisionInput],
                        offset: int) -> torch.Tensor:
        """(3, B, T) positions of chunks computed alone, shifted to start at `offset`."""
        if not media:
            pos = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)
        else:
            pos, _ = self.model.model.get_rope_index(ids, **self.vision_kwargs(ids, media))
        return pos + offset

    def vision_kwargs(self, ids: torch.Tensor, media: list[VisionInput]) -> dict[str, Any]:
        """What the model reads about `media` besides their encodings: token types and grids
        (and, for clips, seconds per temporal group: Qwen2.5-VL's positions use them)."""
        kwargs: dict[str, Any] = {"mm_token_type_ids": self.prompting.token_types(ids)}
        images = [m for m in media if m.kind == "image"]
        videos = [m for m in media if m.kind == "video"]
        if images:
            kwargs["image_grid_thw"] = grids(images)
        if videos:
            kwargs["video_grid_thw"] = grids(videos)
            kwargs["second_per_grid_ts"] = torch.tensor(
                [m.payload.seconds_per_group for m in videos])
        return kwargs

    def model_kwargs(self, ids: torch.Tensor, media: list[VisionInput],
                     encoded: dict[str, Any] | None) -> dict[str, Any]:
        """The multimodal keyword arguments of a forward over `ids` holding `media`."""
        if not media:
            return {}
        kwargs = {k: v.to(self.device) for k, v in self.vision_kwargs(ids, media).items()
                  if k != "second_per_grid_ts"}
        kwargs["mm_encoder_outputs"] = dict(encoded if encoded is not None
                                            else self.encode(media))
        return kwargs

    @torch.inference_mode()
    def forward(self, kv: KVState, ids: list[int], media: list[VisionInput] | None = None,
                encoded: dict[str, Any] | None = None, num_logits: int = 1) -> torch.Tensor:
        """Append `ids` (with the placeholders of `media`, in order) to `kv`; returns
        (num_logits, V) float32 logits of the last `num_logits` positions, on the device."""
        media = media or []
        if not media and self.static is not None and self.static.fits([kv], len(ids)):
            return self.static.step(self, [kv], [ids])[0][-num_logits:]
        input_ids = torch.tensor([ids], dtype=torch.long)
        positions = self.chunk_positions(input_ids, media, kv.next_pos)
        out = self.model(
            input_ids=input_ids.to(self.device), position_ids=positions.to(self.device),
            cache=kv.cache, use_cache=True, logits_to_keep=num_logits,
            **self.model_kwargs(input_ids, media, encoded),
        )
        self.num_forwards += 1
        kv.record(ids, positions[:, 0])
        return out.logits[0, -num_logits:].float()


def grids(media: list[VisionInput]) -> torch.Tensor:
    return torch.cat([m.payload.grid_thw for m in media])


def _pixels(media: list[VisionInput], device: torch.device) -> torch.Tensor:
    return torch.cat([m.payload.pixel_values for m in media]).to(device)
