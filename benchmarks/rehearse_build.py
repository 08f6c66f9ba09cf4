"""What `rehearse.py` builds: the published Cosmos3 configurations (tests/fixtures/published/)
as real diffusers / transformers modules with no memory behind them, and two dispatch modes that
measure a fake run (peak live tensor bytes; bytes each collective sends).

- `count_params`: each component built on the `meta` device (shapes only), counted;
- `fake_pipeline` / `fake_reasoner`: the same classes built under a `FakeTensorMode`, so that
  worldserve's own runners can run them: every op computes its output's shape and dtype (a
  mismatch raises, as on a GPU) and allocates nothing. Host-side data (token ids, positions,
  the scheduler's timesteps, the noise) stays real; whatever meets a weight turns fake.

Nothing here ran on a GPU: a rehearsal checks shapes, dtypes and byte counts, not kernels.
"""

from __future__ import annotations

import json
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "published"
MODELS = ("nano", "super", "edge")
BF16 = 2


def load_fixture(name: str) -> dict[str, Any]:
    """One published configuration (cosmos3_<name>.json): configs, sources, published figures."""
    return json.loads((FIXTURES / f"cosmos3_{name}.json").read_text())


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built in `dtype` (what `from_pretrained(dtype=...)` gives) without a `.to()`
    afterwards, which cannot swap fake parameters."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def build_transformer(fx: dict[str, Any]) -> nn.Module:
    """The generator transformer in bf16, its `time_embedder` in float32 (the class's
    `_keep_in_fp32_modules`, as `from_pretrained` keeps it)."""
    from diffusers.models.embeddings import TimestepEmbedding
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    with default_dtype(torch.bfloat16):
        transformer = Cosmos3OmniTransformer.from_config(fx["transformer"])
    transformer.time_embedder = TimestepEmbedding(in_channels=256,
                                                  time_embed_dim=transformer.config.hidden_size)
    return transformer.eval()


def build_vae(fx: dict[str, Any]) -> nn.Module:
    from diffusers import AutoencoderKLWan

    with default_dtype(torch.bfloat16):
        return AutoencoderKLWan.from_config(fx["vae"]).eval()


def build_reasoner(fx: dict[str, Any]) -> nn.Module:
    """The transformers reasoner (Omni: Qwen3-VL; Edge: SigLIP2 + Nemotron) in bf16."""
    from transformers import (
        Cosmos3EdgeConfig,
        Cosmos3EdgeForConditionalGeneration,
        Cosmos3OmniConfig,
        Cosmos3OmniForConditionalGeneration,
    )

    fields = {k: v for k, v in fx["reasoner"].items() if k not in ("architectures", "model_type")}
    edge = fx["reasoner"]["model_type"] == "cosmos3_edge"
    config = Cosmos3EdgeConfig(**fields) if edge else Cosmos3OmniConfig(**fields)
    with default_dtype(torch.bfloat16):
        model = (Cosmos3EdgeForConditionalGeneration(config) if edge
                 else Cosmos3OmniForConditionalGeneration(config))
    return model.eval()


def build_sound(fx: dict[str, Any]) -> nn.Module | None:
    from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer

    if fx.get("sound_tokenizer") is None:
        return None
    with default_dtype(torch.bfloat16):
        return Cosmos3AVAEAudioTokenizer.from_config(fx["sound_tokenizer"])


def numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def count_params(fx: dict[str, Any]) -> dict[str, int]:
    """Parameters per component, built on `meta` with the real classes. `reasoner_llm` is the
    text decoder and its head (what the generator transformer shares), `reasoner_vision` the
    rest (vision tower, merger / projector: the repository's vision_encoder folder)."""
    with torch.device("meta"):
        reasoner = build_reasoner(fx)
        out = {"transformer": numel(build_transformer(fx)), "vae": numel(build_vae(fx)),
               "sound_tokenizer": numel(build_sound(fx)), "reasoner": numel(reasoner)}
    llm = numel(reasoner.model.language_model) + numel(reasoner.get_output_embeddings())
    out.update(reasoner_llm=llm, reasoner_vision=out["reasoner"] - llm)
    out["repo"] = (out["transformer"] + out["reasoner_vision"] + out["vae"]
                   + out["sound_tokenizer"])
    return out


def fake_pipeline(fx: dict[str, Any], mode: Any, dev_dir: Path) -> Any:
    """A Cosmos3OmniPipeline of the published transformer and VAE (fake), with the dev
    checkpoint's tokenizer and scheduler (real: token ids and timesteps are host data)."""
    from diffusers import UniPCMultistepScheduler
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline
    from transformers import AutoTokenizer

    with mode:
        transformer, vae, sound = build_transformer(fx), build_vae(fx), build_sound(fx)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer, vae=vae,
        text_tokenizer=AutoTokenizer.from_pretrained(dev_dir / "text_tokenizer"),
        scheduler=UniPCMultistepScheduler.from_pretrained(dev_dir / "scheduler"),
        sound_tokenizer=sound, safety_checker=None, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_bytes(pipe: Any) -> int:
    """What a generation stage holds: transformer, VAE and sound tokenizer (when shipped)."""
    parts = (pipe.transformer, pipe.vae, pipe.sound_tokenizer)
    return sum(tensor_bytes(part) for part in parts if part is not None)


def tensor_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each storage once (shared or tied ones too)."""
    seen: dict[int, int] = {}
    for t in (*module.parameters(), *module.buffers()):
        for storage in get_untyped_storages(t):
            seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


class PeakTracker(TorchDispatchMode):
    """Live bytes of the tensors created while active (each storage once, freed when its last
    tensor dies) and their peak: a step's activations, caches and temporaries. Storages of
    the modules passed to `external` (the weights) count as already there."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = WeakIdKeyDictionary()
        self.live = 0
        self.peak = 0

    def external(self, *modules: nn.Module | None) -> None:
        for module in modules:
            if module is None:
                continue
            for t in (*module.parameters(), *module.buffers()):
                for storage in get_untyped_storages(t):
                    self._seen[storage] = 0

    def _free(self, num_bytes: int) -> None:
        self.live -= num_bytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            for storage in get_untyped_storages(t):
                if storage not in self._seen:
                    size = storage.nbytes()
                    self._seen[storage] = size
                    self.live += size
                    weakref.finalize(storage, self._free, size)
        self.peak = max(self.peak, self.live)
        return out


class DtypeChecks(TorchDispatchMode):
    """The dtype checks the real kernels make and the fake (meta) ones skip: a matmul or a
    convolution of two dtypes (a bf16 activation into a float8 weight, issue 31 item 1) raises
    as on a GPU ("expected m1 and m2 to have the same dtype")."""

    OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ in self.OPS:
            dtypes = {t.dtype for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
            if len(dtypes) > 1:
                raise RuntimeError(f"{func}: expected m1 and m2 to have the same dtype, but "
                                   f"got: {' != '.join(sorted(str(d) for d in dtypes))}")
        return func(*args, **(kwargs or {}))


class CollectiveCounter(TorchDispatchMode):
    """Calls and bytes each c10d collective sends from this rank, by op and group size: an
    all-to-all sends (size - 1) / size of its input, an all-gather its input to size - 1
    peers, a send its tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket).removeprefix("c10d.")
        if str(func).startswith("c10d."):
            self._count(name, args)
        return func(*args, **(kwargs or {}))

    def _count(self, name: str, args: Any) -> None:
        from torch.distributed.distributed_c10d import ProcessGroup

        boxed = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        size = ProcessGroup.unbox(boxed).size() if boxed is not None else 1
        sent = 0
        if name == "alltoall_base_":
            sent = _nbytes(args[1]) * (size - 1) // max(1, size)
        elif name == "allgather_":
            sent = sum(_nbytes(t) for t in tree_leaves(args[1])) * (size - 1)
        elif name == "send":
            sent = sum(_nbytes(t) for t in tree_leaves(args[0]))
        key = f"{name}/{size}"
        entry = self.ops.setdefault(key, {"calls": 0, "bytes_sent": 0})
        entry["calls"] += 1
        entry["bytes_sent"] += sent

    @property
    def bytes_sent(self) -> int:
        return sum(entry["bytes_sent"] for entry in self.ops.values())


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
