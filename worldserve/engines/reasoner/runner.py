"""Model calls: vision encoding, chunk positions (M-RoPE) and forwards over a KVState."""

from __future__ import annotations

from typing import Any

import torch

from worldserve.engines.reasoner.kv import KVState
from worldserve.engines.reasoner.prompt import ImageInput


class ModelRunner:
    """Wraps a Qwen-VL `...ForConditionalGeneration`; every call runs under inference mode."""

    def __init__(self, model: Any, image_token_id: int) -> None:
        self.model = model
        self.image_token_id = image_token_id
        self.device = next(model.parameters()).device
        text_config = getattr(model.config, "text_config", model.config)
        self.vocab_size = int(text_config.vocab_size)
        self.max_position_embeddings = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self.num_forwards = 0

    @torch.inference_mode()
    def encode_images(self, images: list[ImageInput]) -> Any:
        """Vision tower output for `images` (a session keeps it per frame for re-prefill)."""
        pixels = torch.cat([im.pixel_values for im in images]).to(self.device)
        return self.model.model.get_image_features(pixels, _grids(images).to(self.device),
                                                   return_dict=True)

    def chunk_positions(self, ids: torch.Tensor, images: list[ImageInput], offset: int) -> torch.Tensor:
        """(3, 1, T) positions of a chunk computed alone, shifted to start at `offset`."""
        if not images:
            pos = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
        else:
            pos, _ = self.model.model.get_rope_index(
                ids, mm_token_type_ids=self.mm_token_type_ids(ids), image_grid_thw=_grids(images)
            )
        return pos + offset

    def mm_token_type_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids == self.image_token_id).long()

    @torch.inference_mode()
    def forward(self, kv: KVState, ids: list[int], images: list[ImageInput] | None = None,
                encoded: Any = None, num_logits: int = 1) -> torch.Tensor:
        """Append `ids` (with the placeholders of `images`, in order) to `kv`; returns
        (num_logits, V) float32 logits of the last `num_logits` positions."""
        images = images or []
        input_ids = torch.tensor([ids], dtype=torch.long)
        positions = self.chunk_positions(input_ids, images, kv.next_pos)
        kwargs: dict[str, Any] = {}
        if images:
            if encoded is None:
                encoded = self.encode_images(images)
            kwargs["mm_encoder_outputs"] = {"image": encoded}
            kwargs["image_grid_thw"] = _grids(images).to(self.device)
            kwargs["mm_token_type_ids"] = self.mm_token_type_ids(input_ids).to(self.device)
        out = self.model(
            input_ids=input_ids.to(self.device), position_ids=positions.to(self.device),
            cache=kv.cache, use_cache=True, logits_to_keep=num_logits, **kwargs,
        )
        self.num_forwards += 1
        kv.record(ids, positions[:, 0])
        return out.logits[0, -num_logits:].float()


def _grids(images: list[ImageInput]) -> torch.Tensor:
    return torch.cat([im.grid_thw for im in images])
