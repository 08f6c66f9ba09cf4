"""Model calls: vision encoding, chunk positions (M-RoPE) and forwards over a KVState.

Loading goes through `processor.load_vlm` (the official processor where it can be built, else
the Pil image-processor shim). `QwenVLRunner` satisfies the reasoner's runner contract
(engines/reasoner/contract.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from worldserve.models.common import count_parameters
from worldserve.models.qwen_vl.kv import KVState, PackedBatch, new_cache
from worldserve.models.qwen_vl.processor import IMAGE_PAD, load_vlm
from worldserve.models.types import ImageInput, ModelLoadError


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu") -> QwenVLRunner:
    """The registry's reasoner loader for a Qwen-VL checkpoint directory."""
    try:
        model, processor = load_vlm(model_dir, dtype=dtype, device=device)
        return QwenVLRunner(model, processor)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a vision-language model from {model_dir}: "
                             f"{exc}") from exc


class QwenVLRunner:
    """Wraps a Qwen-VL `...ForConditionalGeneration`; every call runs under inference mode.

    The engine uses only the processor's image processor and tokenizer (it expands image
    placeholders itself) and the checkpoint's chat template.
    """

    def __init__(self, model: Any, processor: Any) -> None:
        tokenizer = processor.tokenizer
        template = getattr(processor, "chat_template", None) or tokenizer.chat_template
        if not template:
            raise ValueError("the checkpoint has no chat template (chat_template.jinja/json or "
                             "in the tokenizer config)")
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = processor.image_processor
        self.chat_template = template
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.num_params = count_parameters(model)
        self.device = next(model.parameters()).device
        text_config = getattr(model.config, "text_config", model.config)
        self.vocab_size = int(text_config.vocab_size)
        self.max_position_embeddings = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self.num_forwards = 0
        self.num_packs = 0  # batched-decode caches packed so far (stats, tests)
        self.last_batch_rows: list[int] = []  # batch row of each sequence, last batched forward
        self._packed: PackedBatch | None = None

    def new_kv(self) -> KVState:
        """An empty cache for one sequence (a session or a chat request)."""
        return KVState(self.model.config)

    def forward_decode_batch(self, kvs: list[KVState], fed: list[list[int]]) -> list[torch.Tensor]:
        """One decode step of several sequences in one forward (see `forward_decode_batch`)."""
        return forward_decode_batch(self, kvs, fed)

    def forward_prefill_batch(self, kvs: list[KVState], ids: list[list[int]],
                              images: list[list[ImageInput]]) -> list[torch.Tensor]:
        """One chunk per sequence prefilled in one forward (see `forward_prefill_batch`)."""
        return forward_prefill_batch(self, kvs, ids, images)

    @torch.inference_mode()
    def encode_images(self, images: list[ImageInput]) -> Any:
        """Vision tower output for `images` (a session keeps it per frame for re-prefill)."""
        pixels = torch.cat([im.pixel_values for im in images]).to(self.device)
        return self.model.model.get_image_features(pixels, _grids(images).to(self.device),
                                                   return_dict=True)

    def chunk_positions(self, ids: torch.Tensor, images: list[ImageInput],
                        offset: int) -> torch.Tensor:
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
        return out.logits[0, -num_logits:].float().cpu()  # sampling runs on CPU tensors


def _grids(images: list[ImageInput]) -> torch.Tensor:
    return torch.cat([im.grid_thw for im in images])


@torch.inference_mode()
def forward_decode_batch(runner: QwenVLRunner, kvs: list[KVState],
                         fed: list[list[int]]) -> list[torch.Tensor]:
    """One decode step of several sequences in one forward. `fed[b]` is sequence b's last
    sampled token plus its speculative drafts (if any). Returns (len(fed[b]), V) float32 logits
    per sequence.

    The caches stay packed in one batch (`PackedBatch`) across steps while the same sequences
    decode together; they are packed again only when the batch changes (a sequence joins or
    leaves, or one's cache was replaced). Row b attends to its own [0, length_b) plus its new
    tokens causally (a boolean mask hides the rest); shorter query rows are padded at the end
    (their outputs and K/V are ignored). Positions are per sequence (`next_pos` onward), so
    gaps stay intact.
    """
    if not PackedBatch.supports(kvs):
        return _forward_repacked(runner, kvs, fed)
    return _forward_rows(runner, kvs, fed)


@torch.inference_mode()
def forward_prefill_batch(runner: QwenVLRunner, kvs: list[KVState], ids: list[list[int]],
                          images: list[list[ImageInput]]) -> list[torch.Tensor]:
    """Prefill one chunk per sequence (`ids[b]` with the placeholders of `images[b]`) in one
    forward, the vision tower run once for all the images; returns each chunk's last-position
    logits (V,). Same packed batch and masking as `forward_decode_batch`; each chunk keeps the
    positions it would get alone."""
    if not PackedBatch.supports(kvs):  # e.g. a session's first frame: nothing to pack yet
        return [runner.forward(kv, chunk, imgs)[-1] for kv, chunk, imgs in zip(kvs, ids, images)]
    positions = [runner.chunk_positions(torch.tensor([chunk]), imgs, kv.next_pos)[:, 0]
                 for kv, chunk, imgs in zip(kvs, ids, images)]
    rows = _forward_rows(runner, kvs, ids, positions, images, last_only=True)
    return [row[-1] for row in rows]


def _forward_rows(runner: QwenVLRunner, kvs: list[KVState], fed: list[list[int]],
                  positions: list[torch.Tensor] | None = None,
                  images: list[list[ImageInput]] | None = None,
                  last_only: bool = False) -> list[torch.Tensor]:
    """Append `fed[i]` to `kvs[i]` for every i in one forward over their packed batch.
    `positions[i]`: (3, len(fed[i])), default `next_pos` onward; `images[i]`: the images of
    `fed[i]`'s placeholders. Returns per sequence the logits of its fed tokens (only the last
    one's when `last_only`)."""
    width = max(len(f) for f in fed)
    packed = _packed_for(runner, kvs, width)
    rows = [packed.rows[id(kv)] for kv in kvs]
    runner.last_batch_rows = rows
    num_rows = len(packed.kvs)
    by_row: list[list[int]] = [[] for _ in range(num_rows)]
    images_by_row: list[list[ImageInput]] = [[] for _ in range(num_rows)]
    steps = torch.arange(width)
    pos = (torch.tensor([kv.next_pos for kv in packed.kvs]).view(-1, 1) + steps)
    pos = pos.unsqueeze(0).repeat(3, 1, 1)
    for i, b in enumerate(rows):
        by_row[b] = fed[i]
        if positions is not None:
            n = len(fed[i])
            pos[:, b, :n] = positions[i]
            pos[:, b, n:] = positions[i][:, -1:]  # padding: ignored
        if images is not None:
            images_by_row[b] = images[i]
    lengths = torch.tensor([len(kv) for kv in packed.kvs])
    # key j is visible to query i of row b when j < length_b + i + 1
    visible = lengths.view(-1, 1, 1, 1) + steps.view(1, 1, -1, 1) + 1
    mask = torch.arange(int(lengths.max()) + width).view(1, 1, 1, -1) < visible
    tokens = torch.tensor([f + [f[-1]] * (width - len(f)) for f in by_row])
    kwargs: dict[str, Any] = {}
    flat = [im for row_images in images_by_row for im in row_images]  # row-major, as placed
    if flat:
        kwargs["mm_encoder_outputs"] = {"image": runner.encode_images(flat)}
        kwargs["image_grid_thw"] = _grids(flat).to(runner.device)
        kwargs["mm_token_type_ids"] = runner.mm_token_type_ids(tokens).to(runner.device)
    keep: int | torch.Tensor = width
    if last_only:
        lasts = sorted({len(f) - 1 for f in by_row})
        keep = torch.tensor(lasts)
    packed.prepare(lengths, width)
    out = runner.model(
        input_ids=tokens.to(runner.device), position_ids=pos.to(runner.device),
        attention_mask=mask.to(runner.device), cache=packed.cache, use_cache=True,
        logits_to_keep=keep, **kwargs,
    )
    runner.num_forwards += 1
    logits = out.logits.float().cpu()
    for b, kv in enumerate(packed.kvs):
        n = len(by_row[b])
        packed.advance(b, n)
        kv.record(by_row[b], pos[:, b, :n])
    if last_only:
        return [logits[b, lasts.index(len(f) - 1)].unsqueeze(0) for b, f in zip(rows, fed)]
    return [logits[b, : len(f)] for b, f in zip(rows, fed)]


def _packed_for(runner: QwenVLRunner, kvs: list[KVState], width: int) -> PackedBatch:
    """The resident packed batch of `kvs`, packed anew when the batch changed."""
    packed = runner._packed
    if packed is not None and packed.matches(kvs, width):
        return packed
    if packed is not None:
        packed.release(keep=kvs)
    runner._packed = packed = None  # drop the old buffers before allocating the new ones
    runner._packed = PackedBatch(runner.model.config, kvs, width)
    runner.num_packs += 1
    return runner._packed


@torch.inference_mode()
def _forward_repacked(runner: QwenVLRunner, kvs: list[KVState],
                      fed: list[list[int]]) -> list[torch.Tensor]:
    """`forward_decode_batch` for caches that cannot stay packed (layers other than
    `GrowableLayer`): the caches are left-padded into a new batch every step with a boolean
    attention mask (padding masked out); shorter query rows are padded at the end (their
    outputs are ignored). Each sequence's new K/V is appended back to its own cache.
    """
    runner.last_batch_rows = list(range(len(kvs)))
    lengths = [len(kv) for kv in kvs]
    longest, width = max(lengths), max(len(f) for f in fed)
    batch = new_cache(runner.model.config)
    for layer_idx, layer in enumerate(batch.layers):
        first = kvs[0].cache.layers[layer_idx]
        k_shape = (len(kvs), first.keys.shape[1], longest + width, first.keys.shape[-1])
        v_shape = (len(kvs), first.values.shape[1], longest + width, first.values.shape[-1])
        # zeros, not empty: padded slots are masked, but 0 x NaN would still poison the output
        keys, values = first.keys.new_zeros(k_shape), first.values.new_zeros(v_shape)
        for b, (kv, length) in enumerate(zip(kvs, lengths)):
            src = kv.cache.layers[layer_idx]
            keys[b, :, longest - length:longest] = src.keys[0]
            values[b, :, longest - length:longest] = src.values[0]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        layer.length = longest  # the fed tokens are written into the spare slots
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(len(kvs), 1, width, longest + width, dtype=torch.bool)
    for b, length in enumerate(lengths):
        mask[b, 0, :, longest - length:longest] = True
        mask[b, 0, :, longest:] = causal
    steps = torch.arange(width)
    positions = torch.stack([kv.next_pos + steps for kv in kvs]).unsqueeze(0).expand(3, -1, -1)
    tokens = torch.tensor([f + [f[-1]] * (width - len(f)) for f in fed])
    out = runner.model(
        input_ids=tokens.to(runner.device), position_ids=positions.to(runner.device),
        attention_mask=mask.to(runner.device), cache=batch, use_cache=True, logits_to_keep=width,
    )
    runner.num_forwards += 1
    logits = out.logits.float().cpu()
    for b, kv in enumerate(kvs):
        n = len(fed[b])
        for layer_idx, new in enumerate(batch.layers):
            kv.cache.layers[layer_idx].update(new.keys[b:b + 1, :, longest:longest + n],
                                              new.values[b:b + 1, :, longest:longest + n])
        kv.record(fed[b], positions[:, b, :n])
    return [logits[b, : len(fed[b])] for b in range(len(kvs))]
