"""The placement plan: which stage runs on which device(s), in which dtype, and whether it fits.

A pure function of a device inventory (`GpuInfo` per visible GPU) and per-stage checkpoint facts
(`StageDemand`: element counts per stored dtype from the safetensors headers, a few architecture
numbers, the configured device and dtype). No torch, no file reads: the supervisor and
`worldserve check` gather the facts (runtime/checkpoint_facts.py) and the inventory
(runtime/devices.py), then call `plan_placement`. docs/hardware.md describes the rules.

Memory per GPU (all estimates, documented in docs/hardware.md):

    weights   = sum(numel x bytes(dtype))  float tensors in the stage dtype; FP8 tensors 1 byte
                where the stage runs W8A8 (the loaders' rule, fp8/load.py: CUDA, compute
                capability >= 8.9, and fp8_compute w8a8, or auto for the reasoner), else the
                stage dtype (W8A16 dequantises at load); other tensors at their stored size;
                under shard only the transformer blocks' tensors are divided, the rest
                (embeddings, head, VAE, text encoder) is replicated whole on every rank
    load peak the W8A8 reasoner is first built whole in the stage dtype, then its linears are
                swapped for FP8: its weights at load take the W8A16 count
    headroom  generation: the larger of a step and the VAE decode (their sum where a chunked
                decode, vae_decode_chunk_frames, interleaves with the next job's steps)
                  step    24 x tokens x hidden x b / (ulysses x ring)   (activations of one
                          forward at the largest request)
                          + 4 x tokens x hidden x b where ulysses x ring > 1  (what a split
                          does not divide: gathered output, all-to-all buffers)
                          + one gathered block under shard (blocks' bytes / layers)
                  decode  64 x pixels x frames x b / 2 x vae_width / 256
                + 0.5 GiB per process group of the rank (NCCL communicator buffers)
              reasoner:   2 x layers x kv_heads x head_dim x b x kv_tokens x 3.5  (KV cache at
                its worst: own buffers up to 2x their tokens as capacity doubles, plus a packed
                batch copy at 1.5x)
                          + 20 x prefill_tokens x hidden x b                  (prefill chunk)
              realtime:   24 x tokens x hidden x b + KV of the window (as the reasoner's)
    reserve   1 GiB + 2 % of the GPU (CUDA context, allocator fragmentation)
    fits      sum over the stages on the GPU of max(weights + headroom, load peak)
                <= total - reserve

Over the ~400-line guide on purpose: the memory model above, its constants and the assignment
that applies them are read and changed together (docs/hardware.md mirrors them line for line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from worldserve.config import resolve_dtype_name

GIB = 1 << 30
# Live [tokens, hidden] tensors at a forward's peak: the full-size rehearsal measured 17.2
# (Nano), 17.4 (Edge) and 23.1 (Super, whose MLP is 5 x hidden) for a 720p, 189-frame CFG step
# (docs/rehearsal.md; CPU fake tensors, no GPU ran)
ACTIVATION_FACTOR = 24
# Per rank of a sequence split, the [tokens, hidden] tensors it holds whole beyond its share
# (the understanding tokens, the gathered output, the all-to-all buffers): the rehearsal's
# ranks measured 2.3-3.1 (cfg 2 x ulysses 4 and x ring 4, Nano, Super and Edge; a ring rank
# holds the next hop's K/V chunk while it computes)
UNSPLIT_ACTIVATION_FACTOR = 4
# A reasoner prefill chunk's transient beyond the K/V it writes, in [tokens, hidden] tensors:
# the full-size rehearsal measured 13.1 (Nano), 17.5 (Edge) and 19.0 (Super, whose MLP is
# 5 x hidden) at 2,048 tokens (docs/rehearsal.md; CPU fake tensors, no GPU ran)
PREFILL_ACTIVATION_FACTOR = 20
# Wan 2.2 VAE decode at 1280x720x189 in bf16: the rehearsal measured 63.1 (10.23 GiB)
VAE_BYTES_PER_PIXEL_BF16 = 64
VAE_REFERENCE_WIDTH = 256  # Wan 2.2's decoder_base_dim, which the figure above is for
RESERVE_BYTES = 1 * GIB
RESERVE_FRACTION = 0.02
W8A8_MIN_CAPABILITY = (8, 9)  # torch._scaled_mm FP8 (Ada, Hopper, Blackwell)
COMMUNICATOR_BYTES = GIB // 2  # one NCCL communicator's buffers and streams (est.)
KV_GROWTH_FACTOR = 2.0  # a sequence's own K/V buffers hold up to twice its tokens (doubling)
KV_PACKED_FACTOR = 1.5  # a packed batch's rows: 1.5x the longest member (kv.packed_capacity);
# members released from it keep their copy beside it until the next pack

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FLOAT_TENSORS = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
FP8_TENSORS = {"F8_E4M3", "F8_E5M2", "F8_E8M0"}
STORED_BYTES = {"I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1,
                "BOOL": 1}
# Without a pin, stages take free GPUs in this order (the reasoner gets one of its own when
# there are enough), then share the GPU with the most room left.
STAGE_ORDER = ("generation", "reasoner", "realtime")


class PlacementError(ValueError):
    """The plan cannot be carried out (a missing device, a stage that does not fit)."""


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU; `index` counts within this process's visible devices."""

    index: int
    name: str
    total_bytes: int
    capability: tuple[int, int]


@dataclass(frozen=True)
class Workload:
    """The largest work a stage is sized for (token counts feed the headroom formula)."""

    activation_tokens: int = 0  # one forward's sequence (generation, realtime)
    output_pixels: int = 0  # width x height x frames of the largest decode (generation)
    kv_tokens: int = 0  # tokens held in KV caches at once (reasoner, realtime)
    prefill_tokens: int = 0  # one prefill chunk (reasoner)


@dataclass(frozen=True)
class Arch:
    """The architecture numbers the headroom formula needs (0: unknown, term left out)."""

    hidden_size: int = 0
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    vae_width: int = 0  # the VAE decoder's base width (Wan: decoder_base_dim); 0: no VAE


@dataclass(frozen=True)
class StageDemand:
    """What one stage asks for."""

    stage: str  # generation | reasoner | realtime
    device: str = "auto"  # auto | cpu | cuda | cuda:N, as configured
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16, as configured
    dtype_numel: Mapping[str, int] = field(default_factory=dict)  # safetensors dtype -> numel
    arch: Arch = field(default_factory=Arch)
    workload: Workload = field(default_factory=Workload)
    world_size: int = 1  # GPUs of a rank group (stages.generation.parallel)
    shard: int = 1  # ranks sharing one copy of the weights
    seq_split: int = 1  # ulysses x ring: each rank holds 1/seq_split of the activations
    colocate_with: str | None = None  # runs in that stage's process (same devices)
    fp8_compute: str = "auto"  # auto | w8a16 | w8a8 (stages.<stage>.fp8_compute)
    sharded_numel: Mapping[str, int] = field(default_factory=dict)  # of dtype_numel: what
    # shard divides (the transformer blocks); the rest is replicated on every rank
    num_communicators: int = 0  # process groups a rank holds (communicators_per_rank)
    decode_interleaves: bool = True  # a decode's memory may be held while steps run (a
    # chunked VAE decode); False: one job's decode and the steps never overlap


@dataclass(frozen=True)
class StagePlan:
    stage: str
    device: str  # "cpu" or "cuda"
    gpus: tuple[int, ...]  # inventory indices (empty on the CPU)
    dtype: str
    weight_bytes: int  # per GPU (the whole stage on the CPU)
    headroom_bytes: int  # per GPU
    shared_with: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    load_peak_bytes: int = 0  # weights while loading, where above weights + headroom
    transient_bytes: tuple[int, int] = (0, 0)  # generation: (a step, the VAE decode) per GPU,
    # the two terms of its headroom (`transient_terms`)

    @property
    def peak_bytes(self) -> int:
        """What the stage may hold on each of its GPUs at once (loading or serving)."""
        return max(self.weight_bytes + self.headroom_bytes, self.load_peak_bytes)

    @property
    def stage_device(self) -> str:
        """The device the stage process uses: it sees only its GPUs, numbered from 0."""
        return "cuda:0" if self.device == "cuda" else "cpu"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "gpus": list(self.gpus),
                "stage_device": self.stage_device, "dtype": self.dtype,
                "weight_bytes": self.weight_bytes, "headroom_bytes": self.headroom_bytes,
                "load_peak_bytes": self.load_peak_bytes,
                "step_bytes": self.transient_bytes[0], "decode_bytes": self.transient_bytes[1],
                "shared_with": list(self.shared_with), "notes": list(self.notes)}


@dataclass(frozen=True)
class GpuUse:
    gpu: GpuInfo
    stages: tuple[str, ...]
    used_bytes: int  # weights + headroom of its stages
    reserve_bytes: int

    @property
    def fits(self) -> bool:
        return self.used_bytes + self.reserve_bytes <= self.gpu.total_bytes


@dataclass(frozen=True)
class PlacementPlan:
    gpus: tuple[GpuInfo, ...]
    stages: dict[str, StagePlan]
    usage: tuple[GpuUse, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [{"index": g.index, "name": g.name, "total_bytes": g.total_bytes,
                      "capability": list(g.capability)} for g in self.gpus],
            "stages": {name: plan.to_json() for name, plan in self.stages.items()},
            "usage": [{"gpu": u.gpu.index, "stages": list(u.stages), "used_bytes": u.used_bytes,
                       "reserve_bytes": u.reserve_bytes, "total_bytes": u.gpu.total_bytes,
                       "fits": u.fits} for u in self.usage],
            "fits": self.fits, "problems": list(self.problems), "notes": list(self.notes)}


def weight_bytes(dtype_numel: Mapping[str, int], dtype: str, fp8_native: bool) -> int:
    """Bytes the weights take once loaded in `dtype` (see the module docstring)."""
    size = DTYPE_BYTES[dtype]
    total = 0
    for stored, numel in dtype_numel.items():
        if stored in FLOAT_TENSORS:
            total += numel * size
        elif stored in FP8_TENSORS:
            total += numel * (1 if fp8_native else size)
        else:
            total += numel * STORED_BYTES.get(stored, 4)
    return total


def runs_w8a8(demand: StageDemand, capability: tuple[int, int] | None) -> bool:
    """Whether the stage's FP8 linears run W8A8 (fp8/load.py `choose_compute`: the generator
    only when fp8_compute is w8a8, the reasoner also under auto)."""
    if capability is None or capability < W8A8_MIN_CAPABILITY:
        return False
    return demand.fp8_compute == "w8a8" or (demand.fp8_compute == "auto"
                                            and demand.stage == "reasoner")


def communicators_per_rank(cfg: int, ulysses: int, ring: int, shard: int) -> int:
    """Process groups one rank of a group holds (levers/parallel/mesh.py `RankMesh.build`):
    the world group, and one per axis (sp, ulysses, ring, cfg, shard) of 2 ranks or more that
    is not the whole world. An upper bound: NCCL creates a communicator at a group's first
    collective, and an unused group never makes one."""
    world = max(cfg * ulysses * ring, shard)
    if world < 2:
        return 0
    return 1 + sum(1 for size in (ulysses * ring, ulysses, ring, cfg, shard)
                   if 2 <= size < world)


def headroom_bytes(demand: StageDemand, dtype: str, gathered_block_bytes: int = 0) -> int:
    """Activation / KV / decode memory beyond the weights, per GPU (module docstring);
    `gathered_block_bytes`: the one block a rank of a shard group holds gathered in a forward."""
    b = DTYPE_BYTES[dtype]
    arch, work = demand.arch, demand.workload
    kv_per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * b
    if demand.stage == "reasoner":
        kv = int(kv_per_token * work.kv_tokens * (KV_GROWTH_FACTOR + KV_PACKED_FACTOR))
        return kv + PREFILL_ACTIVATION_FACTOR * work.prefill_tokens * arch.hidden_size * b
    step, vae = transient_terms(demand, dtype, gathered_block_bytes)
    transient = step + vae if demand.decode_interleaves else max(step, vae)
    return (transient + kv_per_token * work.kv_tokens
            + COMMUNICATOR_BYTES * demand.num_communicators)


def transient_terms(demand: StageDemand, dtype: str,
                    gathered_block_bytes: int = 0) -> tuple[int, int]:
    """(one step's activations, the VAE decode) per GPU of a generation or realtime stage."""
    b = DTYPE_BYTES[dtype]
    arch, work = demand.arch, demand.workload
    row_bytes = work.activation_tokens * arch.hidden_size * b  # one [tokens, hidden] tensor
    step = ACTIVATION_FACTOR * row_bytes // max(1, demand.seq_split) + gathered_block_bytes
    if demand.seq_split > 1:
        step += UNSPLIT_ACTIVATION_FACTOR * row_bytes
    vae = (VAE_BYTES_PER_PIXEL_BF16 * work.output_pixels * b * arch.vae_width
           // (2 * VAE_REFERENCE_WIDTH))
    return step, vae


def reserve_bytes(gpu: GpuInfo) -> int:
    return RESERVE_BYTES + int(RESERVE_FRACTION * gpu.total_bytes)


def plan_placement(gpus: Sequence[GpuInfo], demands: Sequence[StageDemand]) -> PlacementPlan:
    """The plan for `demands` on `gpus` (see the module docstring); never raises: what cannot
    work is listed in `problems` (the caller stops startup on any)."""
    problems: list[str] = []
    notes: list[str] = []
    by_name = {d.stage: d for d in demands}
    assigned = _assign(list(gpus), demands, problems, notes)
    stages: dict[str, StagePlan] = {}
    for demand in demands:
        indices = assigned.get(demand.stage)
        if indices is None:
            continue
        stages[demand.stage] = _stage_plan(demand, gpus, indices)
    stages = _mark_sharing(stages, notes)
    usage = _usage(gpus, stages)
    for use in usage:
        if not use.fits:
            problems.append(_overflow(use, stages))
    if not gpus and any(d.device == "auto" for d in by_name.values()):
        notes.append("no CUDA GPU visible: stages with device auto run on the CPU")
    if any(p.device == "cpu" for p in stages.values()):
        notes.append("host memory is not checked for stages on the CPU")
    return PlacementPlan(tuple(gpus), stages, tuple(usage), tuple(problems), tuple(notes))


def _assign(gpus: list[GpuInfo], demands: Sequence[StageDemand], problems: list[str],
            notes: list[str]) -> dict[str, tuple[int, ...]]:
    """Stage -> inventory indices (empty: the CPU); stages with a problem are left out."""
    out: dict[str, tuple[int, ...]] = {}
    load: dict[int, int] = {g.index: 0 for g in gpus}  # bytes promised so far
    order = sorted(demands, key=lambda d: (d.colocate_with is not None, _pin(d) is None,
                                           _rank(d.stage)))
    for demand in order:
        if demand.colocate_with is not None:
            if demand.colocate_with in out:
                out[demand.stage] = out[demand.colocate_with]
            continue
        indices = _choose(demand, gpus, load, out, problems)
        if indices is None:
            continue
        out[demand.stage] = indices
        per_gpu = _per_gpu_bytes(demand, gpus, indices)
        for i in indices:
            load[i] += per_gpu
    return out


def _choose(demand: StageDemand, gpus: list[GpuInfo], load: dict[int, int],
            taken: dict[str, tuple[int, ...]], problems: list[str]) -> tuple[int, ...] | None:
    setting = f"stages.{demand.stage}.device"
    want = max(1, demand.world_size)
    if demand.device == "cpu" or (demand.device == "auto" and not gpus):
        return ()
    if not gpus:
        problems.append(f"{setting} is {demand.device!r} but no CUDA GPU is visible "
                        "(torch.cuda.is_available() is False here); use --device cpu or auto")
        return None
    pin = _pin(demand)
    if pin is not None:
        if pin + want > len(gpus):
            group = f" and its rank group needs {want} GPUs from there" if want > 1 else ""
            problems.append(f"{setting} is 'cuda:{pin}'{group} but {len(gpus)} GPU(s) are "
                            f"visible (cuda:0..cuda:{len(gpus) - 1})")
            return None
        return tuple(range(pin, pin + want))
    if want > len(gpus):
        problems.append(f"stages.{demand.stage}.parallel asks for {want} GPUs (one per rank) "
                        f"but {len(gpus)} are visible")
        return None
    used = {i for indices in taken.values() for i in indices}
    # the largest free GPUs first (stages are placed largest first: generation, reasoner)
    free = [g.index for g in sorted(gpus, key=lambda g: (-g.total_bytes, g.index))
            if g.index not in used]
    if len(free) >= want:
        return tuple(sorted(free[:want]))
    # share: the GPUs with the most room left after what is already placed on them
    roomiest = sorted(gpus, key=lambda g: (load[g.index] - g.total_bytes, g.index))
    return tuple(sorted(g.index for g in roomiest[:want]))


def _pin(demand: StageDemand) -> int | None:
    head, _, index = demand.device.partition(":")
    return int(index) if head == "cuda" and index else None


def _rank(stage: str) -> int:
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


def _stage_capability(gpus: Sequence[GpuInfo], indices: tuple[int, ...]) -> tuple[int, int] | None:
    caps = [g.capability for g in gpus if g.index in indices]
    return min(caps) if caps else None


def _per_gpu_bytes(demand: StageDemand, gpus: Sequence[GpuInfo], indices: tuple[int, ...]) -> int:
    return _stage_plan(demand, gpus, indices).peak_bytes


def _stage_plan(demand: StageDemand, gpus: Sequence[GpuInfo],
                indices: tuple[int, ...]) -> StagePlan:
    device = "cuda" if indices else "cpu"
    capability = _stage_capability(gpus, indices)
    dtype = resolve_dtype_name(demand.dtype, device, capability)
    w8a8 = runs_w8a8(demand, capability)
    notes: list[str] = []
    has_fp8 = any(stored in FP8_TENSORS for stored in demand.dtype_numel)
    if has_fp8:
        notes.append("FP8 weights counted at 1 byte (W8A8)" if w8a8 else
                     f"FP8 weights counted in {dtype} (W8A16: dequantised at load)")
    shard = demand.shard if indices else 1
    weights = _sharded_weight_bytes(demand, dtype, w8a8, shard, notes)
    gathered = 0
    if shard > 1 and demand.sharded_numel and demand.arch.num_layers:
        gathered = weight_bytes(demand.sharded_numel, dtype, w8a8) // demand.arch.num_layers
    load_peak = 0
    if w8a8 and has_fp8 and demand.stage == "reasoner":
        load_peak = _sharded_weight_bytes(demand, dtype, False, shard, [])
        notes.append(f"loads whole in {dtype} before its linears turn FP8: "
                     f"{gib(load_peak)} at load")
    if demand.num_communicators:
        notes.append(f"{demand.num_communicators} process groups per rank: "
                     f"{gib(demand.num_communicators * COMMUNICATOR_BYTES)} of NCCL buffers")
    if demand.colocate_with is not None:
        notes.append(f"runs in the {demand.colocate_with} process; counted in full (it shares "
                     "the generator's text weights, so this over-estimates)")
    transient = (transient_terms(demand, dtype, gathered) if demand.stage == "generation"
                 else (0, 0))
    return StagePlan(demand.stage, device, indices, dtype, weights,
                     headroom_bytes(demand, dtype, gathered), notes=tuple(notes),
                     load_peak_bytes=load_peak, transient_bytes=transient)


def _sharded_weight_bytes(demand: StageDemand, dtype: str, w8a8: bool, shard: int,
                          notes: list[str]) -> int:
    """Weights per GPU: under shard the blocks' part divided, the replicated rest whole."""
    total = weight_bytes(demand.dtype_numel, dtype, w8a8)
    if shard <= 1:
        return total
    if not demand.sharded_numel:
        notes.append(f"shard={shard}: which tensors are the blocks is unknown, so the weights "
                     "are counted whole")
        return total
    blocks = weight_bytes(demand.sharded_numel, dtype, w8a8)
    notes.append(f"transformer blocks split {shard} ways (shard={shard}); the other "
                 f"{gib(total - blocks)} of weights replicated on every rank")
    return total - blocks + -(-blocks // shard)


def _mark_sharing(stages: dict[str, StagePlan], notes: list[str]) -> dict[str, StagePlan]:
    out = {}
    for name, plan in stages.items():
        others = tuple(other for other, p in stages.items()
                       if other != name and set(p.gpus) & set(plan.gpus))
        out[name] = StagePlan(plan.stage, plan.device, plan.gpus, plan.dtype, plan.weight_bytes,
                              plan.headroom_bytes, others, plan.notes, plan.load_peak_bytes,
                              plan.transient_bytes)
    for index in sorted({i for p in out.values() for i in p.gpus}):
        names = [n for n, p in out.items() if index in p.gpus]
        if len(names) > 1:
            notes.append(f"cuda:{index} is shared by {' and '.join(names)}")
    return out


def _usage(gpus: Sequence[GpuInfo], stages: dict[str, StagePlan]) -> tuple[GpuUse, ...]:
    out = []
    for gpu in gpus:
        names = tuple(n for n, p in stages.items() if gpu.index in p.gpus)
        used = sum(stages[n].peak_bytes for n in names)
        out.append(GpuUse(gpu, names, used, reserve_bytes(gpu)))
    return tuple(out)


def _overflow(use: GpuUse, stages: dict[str, StagePlan]) -> str:
    parts = ", ".join(_stage_part(n, stages[n]) for n in use.stages)
    return (f"cuda:{use.gpu.index} ({use.gpu.name}, {gib(use.gpu.total_bytes)}) cannot hold "
            f"{' and '.join(use.stages)}: {parts} + {gib(use.reserve_bytes)} reserve = "
            f"{gib(use.used_bytes + use.reserve_bytes)}; use more GPUs "
            "(stages.generation.parallel shard), float8 weights, or a smaller model")


def _stage_part(name: str, plan: StagePlan) -> str:
    part = f"{name} {gib(plan.weight_bytes)} weights + {gib(plan.headroom_bytes)} headroom"
    if plan.load_peak_bytes > plan.weight_bytes + plan.headroom_bytes:
        part += f" ({gib(plan.load_peak_bytes)} while loading)"
    return part


def gib(num_bytes: int) -> str:
    """Bytes for people: GiB, or MiB below 0.1 GiB (the dev checkpoints are tiny)."""
    if num_bytes < GIB // 10:
        return f"{num_bytes / (1 << 20):.2f} MiB"
    return f"{num_bytes / GIB:.2f} GiB"


def visible_devices(indices: Sequence[int], parent_visible: Sequence[str] | None) -> str:
    """CUDA_VISIBLE_DEVICES for a stage on `indices` (counted within the parent's own
    CUDA_VISIBLE_DEVICES when it has one)."""
    if parent_visible is None:
        return ",".join(str(i) for i in indices)
    return ",".join(parent_visible[i] for i in indices)


def format_plan(plan: PlacementPlan) -> list[str]:
    """The plan as log / terminal lines."""
    lines = [f"GPUs: {len(plan.gpus)}" + "".join(
        f"\n  cuda:{g.index} {g.name} {gib(g.total_bytes)} sm{g.capability[0]}{g.capability[1]}"
        for g in plan.gpus)]
    for name, stage in plan.stages.items():
        where = ("cpu" if stage.device == "cpu"
                 else ",".join(f"cuda:{i}" for i in stage.gpus))
        shared = f" (shared with {', '.join(stage.shared_with)})" if stage.shared_with else ""
        lines.append(f"{name}: {where}{shared} {stage.dtype} weights {gib(stage.weight_bytes)} "
                     f"headroom {gib(stage.headroom_bytes)}"
                     + "".join(f"; {note}" for note in stage.notes))
    for use in plan.usage:
        lines.append(f"cuda:{use.gpu.index}: {gib(use.used_bytes)} + {gib(use.reserve_bytes)} "
                     f"reserve of {gib(use.gpu.total_bytes)}: "
                     f"{'fits' if use.fits else 'DOES NOT FIT'}")
    lines += [f"note: {note}" for note in plan.notes]
    lines += [f"problem: {problem}" for problem in plan.problems]
    lines.append(f"fits: {'yes' if plan.fits else 'no'}")
    return lines
