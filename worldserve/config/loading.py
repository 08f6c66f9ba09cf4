"""What every stage loads and where: device, dtype, model path, FP8 compute, warm-up, stage
sockets, and the generation stage's rank group (one request across several devices)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from worldserve.config.base import FrozenConfig, is_loopback_host, lift_overrides

# `--device`: auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda (the placement plan
# picks the GPU(s)), cuda:N (that GPU of the visible ones). docs/hardware.md.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]


def check_device_name(device: str) -> str:
    """`device` when it is a spelling worldserve accepts; else ValueError naming it."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N")
    return device


BF16_MIN_CAPABILITY = (8, 0)  # older GPUs get float16 under dtype auto


def resolve_dtype_name(dtype: str, device: str, capability: tuple[int, int] | None = None) -> str:
    """`auto` -> bfloat16 on CUDA (float16 below compute capability 8.0), float32 on the CPU."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    if capability is not None and capability < BF16_MIN_CAPABILITY:
        return "float16"
    return "bfloat16"


class StageConfig(FrozenConfig):
    """Settings every stage process shares."""

    # server_args_overrides keys moved into a stage field (override key -> field name), and
    # keys read from the overrides as they are; anything else is a startup error.
    LIFTED_OVERRIDES: ClassVar[dict[str, str]] = {"warmup_mode": "warmup_mode"}
    ACCEPTED_OVERRIDES: ClassVar[frozenset[str]] = frozenset({"host"})

    enabled: bool = True
    # The resolution of `auto` lives in runtime/placement.py.
    device: str = Field(default="auto", description=(
        "auto | cpu | cuda | cuda:N for every stage; auto: CUDA when torch sees a GPU (the "
        "placement plan picks which), else the CPU."))
    dtype: DtypeName = Field(default="auto", description=(
        "Weights and compute dtype of every stage; auto: bfloat16 on CUDA (float16 below "
        "compute capability 8.0), float32 on the CPU."))
    model_path: Path | None = None
    served_model_name: str | None = Field(default=None, description=(
        "Name reported as `model` in responses."))
    warmup_mode: Literal["off", "server"] = "off"
    start_timeout_s: float = Field(default=300.0, gt=0)
    # Stage sockets: "ipc" (a socket file in the server's run folder) or "tcp" on `host`.
    ipc: Literal["ipc", "tcp"] = "ipc"
    host: str = "127.0.0.1"
    # Engine-specific knobs passed through to the stage (SGLang's server_args naming).
    server_args_overrides: dict[str, Any] = Field(default_factory=dict)
    # ModelOpt FP8 checkpoints (Cosmos3, docs/generation.md): auto = W8A8 on CUDA with compute
    # capability >= 8.9, else W8A16 (dequantised once at load); w8a8 where it cannot run fails.
    fp8_compute: Literal["auto", "w8a16", "w8a8"] = "auto"

    def quant_options(self) -> dict[str, str]:
        """Loader keyword arguments for quantised checkpoints: none at the default, so that a
        family without FP8 support is only handed `fp8_compute` when it was asked for."""
        return {} if self.fp8_compute == "auto" else {"fp8_compute": self.fp8_compute}

    @field_validator("device")
    @classmethod
    def _device_is_known(cls, device: str) -> str:
        return check_device_name(device.strip().lower())

    @field_validator("host")
    @classmethod
    def _host_is_loopback(cls, host: str) -> str:
        if not is_loopback_host(host):
            raise ValueError(f"stage sockets bind loopback only; got {host!r} (use 127.0.0.1)")
        return host

    @model_validator(mode="before")
    @classmethod
    def _known_overrides_only(cls, data: Any) -> Any:
        return lift_overrides(data, cls.LIFTED_OVERRIDES, cls.ACCEPTED_OVERRIDES)

    @field_validator("server_args_overrides")
    @classmethod
    def _override_host_is_loopback(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        # Exactly 127.0.0.1 (native-media spec 1.3): `localhost` or `::` may resolve elsewhere.
        host = overrides.get("host")
        if host is not None and host != "127.0.0.1":
            raise ValueError(f"host: stage sockets bind 127.0.0.1 only; got {host!r}")
        return overrides


PARALLEL_AXES = ("cfg", "ulysses", "ring", "shard")


class GenerationParallelConfig(FrozenConfig):
    """One request across several ranks (docs/parallel.md): cfg x ulysses x ring ranks
    compute, `shard` splits the transformer blocks' weights (a group of max(cfg x ulysses x
    ring, shard) ranks, one device each). Also written `cfg=2,ulysses=2` (the
    `--generation-parallel` flag)."""

    cfg: int = Field(default=1, ge=1, le=2)  # 2: cond and uncond forwards on two ranks
    ulysses: int = Field(default=1, ge=1, le=64)  # sequence parallel, all-to-all over heads
    ring: int = Field(default=1, ge=1, le=64)  # sequence parallel, ring over sequence chunks
    shard: int = Field(default=1, ge=1, le=64)  # ranks sharing one copy of the block weights
    vae: bool = True  # split the VAE decode across the ranks (strips of latent rows)
    # A collective or a peer's answer slower than this fails the group (never a hang).
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if not isinstance(data, str):
            return data
        out: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in data.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in (*PARALLEL_AXES, "vae", "timeout_s"):
                raise ValueError(f"{item!r} is not AXIS=N (axes: {', '.join(PARALLEL_AXES)}; "
                                 f"e.g. cfg=2,ulysses=2)")
            out[key.strip()] = value.strip()
        return out

    @model_validator(mode="after")
    def _group_is_whole(self) -> GenerationParallelConfig:
        compute = self.cfg * self.ulysses * self.ring
        big, small = max(compute, self.shard), min(compute, self.shard)
        if big % small:
            raise ValueError(f"shard={self.shard} and cfg x ulysses x ring = {compute}: one "
                             f"must be a multiple of the other")
        return self

    @property
    def world_size(self) -> int:
        return max(self.cfg * self.ulysses * self.ring, self.shard)


