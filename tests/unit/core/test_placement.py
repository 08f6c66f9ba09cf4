"""The placement planner as a pure function: synthetic GPU inventories, Nano- and Super-sized
element counts (docs/hardware.md; the counts are what safetensors headers of those checkpoints
add up to, notes/gpu-readiness.md section 2)."""

from __future__ import annotations

import pytest

from worldserve.config import resolve_dtype_name
from worldserve.runtime.placement import (
    GIB,
    Arch,
    GpuInfo,
    StageDemand,
    Workload,
    communicators_per_rank,
    format_plan,
    headroom_bytes,
    plan_placement,
    reserve_bytes,
    visible_devices,
    weight_bytes,
)

H200 = 150_754_820_096  # torch.cuda.get_device_properties(0).total_memory of one H200 (141 GB)
NANO_GENERATOR = 15_170_000_000
NANO_REASONER = 8_770_000_000
SUPER_GENERATOR = 64_000_000_000
SUPER_REASONER = 32_000_000_000
NANO_ARCH = Arch(hidden_size=4096, num_layers=36, num_kv_heads=8, head_dim=128, vae_width=256)
GEN_WORK = Workload(activation_tokens=44_672, output_pixels=1280 * 720 * 189)
REASONER_WORK = Workload(kv_tokens=6 * 7000, prefill_tokens=2048)


def gpus(n: int, total: int = H200, capability: tuple[int, int] = (9, 0)) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H200", total, capability) for i in range(n)]


def stages(generator: int = NANO_GENERATOR, reasoner: int = NANO_REASONER, device: str = "auto",
           **generation: object) -> list[StageDemand]:
    generation.setdefault("decode_interleaves", False)  # the default: an unchunked decode
    return [
        StageDemand("generation", device, "auto", {"BF16": generator}, NANO_ARCH, GEN_WORK,
                    **generation),  # type: ignore[arg-type]
        StageDemand("reasoner", device, "auto", {"BF16": reasoner}, NANO_ARCH, REASONER_WORK),
    ]


def test_no_gpu_auto_is_the_cpu_in_float32() -> None:
    plan = plan_placement([], stages())
    assert plan.fits
    for name in ("generation", "reasoner"):
        stage = plan.stages[name]
        assert (stage.device, stage.gpus, stage.dtype, stage.stage_device) == (
            "cpu", (), "float32", "cpu")
    assert plan.stages["generation"].weight_bytes == NANO_GENERATOR * 4


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_no_gpu_and_cuda_asked_stops_naming_the_setting(device: str) -> None:
    plan = plan_placement([], stages(device=device))
    assert not plan.fits
    assert any(f"stages.generation.device is {device!r}" in p for p in plan.problems)
    assert any(f"stages.reasoner.device is {device!r}" in p for p in plan.problems)


def test_a_gpu_index_past_the_inventory_is_named() -> None:
    demands = [StageDemand("generation", "cuda:7", "auto", {"BF16": 1000})]
    plan = plan_placement(gpus(1), demands)
    assert not plan.fits
    assert "'cuda:7'" in plan.problems[0] and "1 GPU(s) are visible" in plan.problems[0]


def test_one_gpu_nano_stages_share_it_in_bfloat16() -> None:
    plan = plan_placement(gpus(1), stages())
    gen, reasoner = plan.stages["generation"], plan.stages["reasoner"]
    assert gen.gpus == reasoner.gpus == (0,)
    assert gen.dtype == reasoner.dtype == "bfloat16" and gen.stage_device == "cuda:0"
    assert gen.shared_with == ("reasoner",) and reasoner.shared_with == ("generation",)
    assert "cuda:0 is shared by generation and reasoner" in plan.notes
    assert gen.weight_bytes == NANO_GENERATOR * 2 and reasoner.weight_bytes == NANO_REASONER * 2
    (use,) = plan.usage
    assert use.used_bytes == sum(s.weight_bytes + s.headroom_bytes for s in (gen, reasoner))
    assert plan.fits  # ~45 GiB of weights + headroom on a 140 GiB GPU


def test_two_gpus_give_the_reasoner_its_own() -> None:
    plan = plan_placement(gpus(2), stages())
    assert plan.stages["generation"].gpus == (0,) and plan.stages["reasoner"].gpus == (1,)
    assert not plan.stages["reasoner"].shared_with and plan.fits


def test_eight_gpus_with_a_rank_group_of_eight_share_one_with_the_reasoner() -> None:
    plan = plan_placement(gpus(8), stages(world_size=8, seq_split=4))
    assert plan.stages["generation"].gpus == tuple(range(8))
    (shared,) = plan.stages["reasoner"].gpus
    assert plan.stages["reasoner"].shared_with == ("generation",)
    assert plan.notes == (f"cuda:{shared} is shared by generation and reasoner",)
    assert plan.fits


def test_eight_gpus_rank_group_of_four_leaves_the_reasoner_a_free_gpu() -> None:
    plan = plan_placement(gpus(8), stages(world_size=4))
    assert plan.stages["generation"].gpus == (0, 1, 2, 3)
    assert plan.stages["reasoner"].gpus == (4,) and not plan.stages["reasoner"].shared_with


def test_a_rank_group_larger_than_the_inventory_is_refused() -> None:
    plan = plan_placement(gpus(2), stages(world_size=4))
    assert any("parallel asks for 4 GPUs" in p and "2 are visible" in p for p in plan.problems)


def test_super_does_not_fit_one_gpu_and_the_problem_has_the_numbers() -> None:
    plan = plan_placement(gpus(1), stages(SUPER_GENERATOR, SUPER_REASONER))
    assert not plan.fits
    (problem,) = plan.problems
    assert problem.startswith("cuda:0 (NVIDIA H200, 140.40 GiB) cannot hold generation and "
                              "reasoner: generation 119.21 GiB weights")
    assert "reasoner 59.60 GiB weights" in problem and "reserve" in problem


def test_super_on_two_gpus_fits_with_the_reasoner_apart() -> None:
    plan = plan_placement(gpus(2), stages(SUPER_GENERATOR, SUPER_REASONER))
    assert plan.fits, plan.problems
    assert plan.stages["generation"].gpus == (0,) and plan.stages["reasoner"].gpus == (1,)
    # "only alone, with little room for activations" (docs/parallel.md)
    gen_gpu = plan.usage[0]
    assert 0 < gen_gpu.gpu.total_bytes - gen_gpu.used_bytes - gen_gpu.reserve_bytes < 8 * GIB


def test_sharding_divides_the_blocks_and_replicates_the_rest() -> None:
    """Only the transformer blocks are split; embeddings, head and VAE stay whole on every
    rank; without block facts nothing is divided (never planned below the truth)."""
    replicated = 3_000_000_000
    blocks = {"BF16": SUPER_GENERATOR - replicated}
    plan = plan_placement(gpus(8), stages(SUPER_GENERATOR, SUPER_REASONER, world_size=8,
                                          shard=8, sharded_numel=blocks))
    gen = plan.stages["generation"]
    assert gen.weight_bytes == replicated * 2 + (SUPER_GENERATOR - replicated) * 2 // 8
    assert any("replicated on every rank" in note for note in gen.notes) and plan.fits
    unknown = plan_placement(gpus(8), stages(SUPER_GENERATOR, SUPER_REASONER, world_size=8,
                                             shard=8)).stages["generation"]
    assert unknown.weight_bytes == SUPER_GENERATOR * 2
    assert any("counted whole" in note for note in unknown.notes)


def fp8_plan(stage: str, capability: tuple[int, int], fp8_compute: str = "auto",
             total: int = H200):
    demand = StageDemand(stage, "auto", "auto", {"F8_E4M3": NANO_GENERATOR},
                         fp8_compute=fp8_compute)
    return plan_placement(gpus(1, total, capability), [demand])


def test_fp8_counts_one_byte_only_where_the_stage_runs_w8a8() -> None:
    """The loaders' rule (fp8/load.py choose_compute), asked at the sm 8.9 boundary: the
    generator loads W8A16 unless fp8_compute is w8a8; the reasoner W8A8 under auto too."""
    numel = {"F8_E4M3": 1000, "BF16": 10, "F32": 3}  # scales are F32
    assert weight_bytes(numel, "bfloat16", fp8_native=True) == 1000 + 20 + 6
    assert weight_bytes(numel, "bfloat16", fp8_native=False) == 2000 + 20 + 6
    one, two = NANO_GENERATOR, NANO_GENERATOR * 2
    for capability, w8a8 in (((8, 6), False), ((8, 9), True), ((9, 0), True)):
        gen = fp8_plan("generation", capability).stages["generation"]
        assert gen.weight_bytes == two and "W8A16" in gen.notes[0]
        asked = fp8_plan("generation", capability, "w8a8").stages["generation"]
        assert asked.weight_bytes == (one if w8a8 else two)
        reasoner = fp8_plan("reasoner", capability).stages["reasoner"]
        assert reasoner.weight_bytes == (one if w8a8 else two)
        # W8A8 loads the whole model in bf16 first, then swaps its linears
        assert reasoner.load_peak_bytes == (two if w8a8 else 0)
        off = fp8_plan("reasoner", capability, "w8a16").stages["reasoner"]
        assert off.weight_bytes == two and off.load_peak_bytes == 0


def test_fp8_super_generator_does_not_fit_an_80gb_card() -> None:
    """W8A16 by default: 2 bytes per weight, ~119 GiB; planned at 1 byte it "fitted" and then
    ran out of memory while loading."""
    h100 = 85_520_809_984
    plan = plan_placement(gpus(1, h100, (9, 0)), [
        StageDemand("generation", "auto", "auto", {"F8_E4M3": SUPER_GENERATOR})])
    assert not plan.fits and "119.21 GiB weights" in plan.problems[0]


def test_the_w8a8_reasoner_load_peak_counts_toward_the_fit() -> None:
    demand = StageDemand("reasoner", "auto", "auto", {"F8_E4M3": 10 * GIB})
    gpu = GpuInfo(0, "small", 16 * GIB, (9, 0))  # 10 GiB served, 20 GiB while loading
    plan = plan_placement([gpu], [demand])
    reasoner = plan.stages["reasoner"]
    assert reasoner.weight_bytes == 10 * GIB and reasoner.peak_bytes == 20 * GIB
    assert not plan.fits and "while loading" in plan.problems[0]


def test_communicators_per_rank_follow_the_layout() -> None:
    assert communicators_per_rank(1, 1, 1, 1) == 0
    assert communicators_per_rank(2, 1, 1, 1) == 1  # the world is the cfg group
    assert communicators_per_rank(2, 4, 1, 1) == 4  # world, sp, ulysses, cfg
    assert communicators_per_rank(2, 2, 2, 1) == 5  # world, sp, ulysses, ring, cfg
    assert communicators_per_rank(1, 3, 1, 3) == 1  # sp = ulysses = shard = the world
    demand = stages(world_size=8, seq_split=4, num_communicators=4)[0]
    assert headroom_bytes(demand, "bfloat16") - headroom_bytes(
        stages(world_size=8, seq_split=4)[0], "bfloat16") == 4 * GIB // 2


def test_unequal_gpus_the_generator_takes_the_largest() -> None:
    small = GpuInfo(0, "NVIDIA L40S", 48 * GIB, (8, 9))
    large = GpuInfo(1, "NVIDIA H200", H200, (9, 0))
    plan = plan_placement([small, large], stages())
    assert plan.stages["generation"].gpus == (1,) and plan.stages["reasoner"].gpus == (0,)
    assert plan.stages["reasoner"].dtype == "bfloat16" and plan.fits


def test_a_realtime_stage_shares_the_gpu_with_the_most_room() -> None:
    small = GpuInfo(0, "NVIDIA L40S", 48 * GIB, (8, 9))
    large = GpuInfo(1, "NVIDIA H200", H200, (9, 0))
    realtime = StageDemand("realtime", "auto", "auto", {"BF16": 2_000_000_000})
    plan = plan_placement([small, large], [*stages(), realtime])
    # generation (~45 GiB with headroom) leaves the H200 more room than the reasoner leaves
    # the L40S
    assert plan.stages["realtime"].gpus == (1,)
    assert plan.stages["realtime"].shared_with == ("generation",)


def test_dtype_auto_follows_the_device_and_the_capability() -> None:
    assert resolve_dtype_name("auto", "cpu") == "float32"
    assert resolve_dtype_name("auto", "cuda:0", (9, 0)) == "bfloat16"
    assert resolve_dtype_name("auto", "cuda:0", (7, 5)) == "float16"
    assert resolve_dtype_name("auto", "cuda:0", (8, 0)) == "bfloat16"  # the boundary itself
    assert resolve_dtype_name("float16", "cpu") == "float16"
    demand = [StageDemand("generation", "auto", "auto", {"BF16": 10})]
    assert plan_placement(gpus(1, capability=(7, 0)), demand).stages["generation"].dtype == \
        "float16"


def test_explicit_dtype_and_pinned_devices_are_kept() -> None:
    demands = [StageDemand("generation", "cuda:1", "float32", {"BF16": 10}),
               StageDemand("reasoner", "cuda:1", "float16", {"BF16": 10})]
    plan = plan_placement(gpus(2), demands)
    assert plan.stages["generation"].gpus == plan.stages["reasoner"].gpus == (1,)
    assert plan.stages["generation"].dtype == "float32"
    assert plan.stages["reasoner"].dtype == "float16"


def test_a_colocated_reasoner_follows_the_generator() -> None:
    demands = stages()
    demands[1] = StageDemand("reasoner", "auto", "auto", {"BF16": NANO_REASONER},
                             colocate_with="generation")
    plan = plan_placement(gpus(4), demands)
    assert plan.stages["reasoner"].gpus == plan.stages["generation"].gpus == (0,)


def test_headroom_formula() -> None:
    b = 2
    reasoner = headroom_bytes(stages()[1], "bfloat16")
    kv_per_token = 2 * 36 * 8 * 128 * b  # 147,456 bytes: notes/gpu-readiness.md section 2
    # KV at its worst: own buffers doubled (2x) beside a packed batch copy (1.5x)
    # the prefill chunk: 20 [tokens, hidden] tensors (the rehearsal's worst was 19.0, Super)
    assert reasoner == int(kv_per_token * 42_000 * 3.5) + 20 * 2048 * 4096 * b
    row = 44_672 * 4096 * b  # one [tokens, hidden] tensor of the largest request
    vae = 64 * 1280 * 720 * 189  # the decode, bf16 (the rehearsal measured 63.1 per pixel)
    # a chunked decode interleaves with steps: both held at once
    generator = headroom_bytes(stages(decode_interleaves=True)[0], "bfloat16")
    assert generator == 24 * row + vae
    split = headroom_bytes(stages(seq_split=4, decode_interleaves=True)[0], "bfloat16")
    assert split == 24 * row // 4 + 4 * row + vae  # what the split does not divide: 4 rows
    assert 4 * GIB < 16 * row < 6 * GIB  # the notes' 4-6 GB per forward
    # an unchunked decode runs between steps: the larger of the two, each boundary exactly
    alone = stages(decode_interleaves=False)[0]
    assert headroom_bytes(alone, "bfloat16") == max(24 * row, vae) == vae
    wide = StageDemand("generation", "auto", "auto", {"BF16": 1}, NANO_ARCH,
                       Workload(activation_tokens=44_672, output_pixels=24 * row // 64),
                       decode_interleaves=False)
    assert headroom_bytes(wide, "bfloat16") == 24 * row  # step == decode: either
    wider = StageDemand("generation", "auto", "auto", {"BF16": 1}, NANO_ARCH,
                        Workload(activation_tokens=44_673, output_pixels=24 * row // 64),
                        decode_interleaves=False)
    assert headroom_bytes(wider, "bfloat16") == 24 * 44_673 * 4096 * b  # the step is larger
    assert headroom_bytes(alone, "bfloat16", gathered_block_bytes=7) == vae  # under the decode
    assert headroom_bytes(wide, "bfloat16", gathered_block_bytes=7) == 24 * row + 7
    plan = plan_placement(gpus(1), stages()).stages  # the two terms, as `check --json` shows
    assert plan["generation"].transient_bytes == (24 * row, vae)
    assert plan["generation"].to_json()["decode_bytes"] == vae
    assert plan["reasoner"].transient_bytes == (0, 0)


def test_a_shard_rank_counts_one_gathered_block() -> None:
    blocks = {"BF16": SUPER_GENERATOR - 3_000_000_000}
    sharded = stages(SUPER_GENERATOR, SUPER_REASONER, world_size=8, shard=8,
                     sharded_numel=blocks, decode_interleaves=True)
    whole = stages(SUPER_GENERATOR, SUPER_REASONER, world_size=8, decode_interleaves=True)
    gen = plan_placement(gpus(8), sharded).stages["generation"]
    ref = plan_placement(gpus(8), whole).stages["generation"]
    assert gen.headroom_bytes - ref.headroom_bytes == blocks["BF16"] * 2 // 36  # one of 36


def test_reserve_and_the_fits_boundary() -> None:
    gpu = GpuInfo(0, "small", 20 * GIB, (9, 0))
    room = gpu.total_bytes - reserve_bytes(gpu)
    exact = [StageDemand("generation", "auto", "float32", {"F32": room // 4})]
    assert plan_placement([gpu], exact).fits
    over = [StageDemand("generation", "auto", "float32", {"F32": room // 4 + 1})]
    assert not plan_placement([gpu], over).fits


def test_cuda_visible_devices_count_within_the_parents() -> None:
    assert visible_devices((0, 1), None) == "0,1"
    assert visible_devices((1,), ["4", "6"]) == "6"
    assert visible_devices((0,), ["GPU-uuid-a", "GPU-uuid-b"]) == "GPU-uuid-a"


def test_the_text_form_says_what_the_json_says() -> None:
    plan = plan_placement(gpus(1), stages())
    text = "\n".join(format_plan(plan))
    assert "generation: cuda:0 (shared with reasoner) bfloat16 weights 28.26 GiB" in text
    assert "fits: yes" in text
    data = plan.to_json()
    assert data["stages"]["generation"]["weight_bytes"] == NANO_GENERATOR * 2
    assert data["usage"][0]["fits"] is True and data["fits"] is True


def test_each_stage_process_sees_only_its_gpus() -> None:
    from worldserve.config import ServerConfig
    from worldserve.runtime.devices import apply_plan, stage_environment

    plan = plan_placement(gpus(2), stages())
    assert stage_environment(plan, "generation", None) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert stage_environment(plan, "reasoner", ["3", "5"]) == {"CUDA_VISIBLE_DEVICES": "5"}
    cpu_plan = plan_placement(gpus(2), [StageDemand("reasoner", "cpu", "auto", {"BF16": 1})])
    assert stage_environment(cpu_plan, "reasoner", None) == {"CUDA_VISIBLE_DEVICES": ""}
    assert stage_environment(plan_placement([], stages()), "reasoner", None) == {}
    # inside its process a stage's first GPU is cuda:0, in the planned dtype
    config = apply_plan(ServerConfig(), plan)
    assert (config.stages.reasoner.device, config.stages.reasoner.dtype) == ("cuda:0", "bfloat16")
    assert config.stages.realtime.device == "auto"  # not in the plan: left as configured
