"""benchmarks/rehearse.py on the published configurations under FakeTensorMode: worldserve's
own runners run the real architectures with no memory behind them. The full 720p x 189-frame
generator step is the benchmark's (tens of seconds on this CPU); here the generator runs the
published Edge model at a small request, and the reasoner runs at full size."""

from __future__ import annotations

import pytest
import torch

from benchmarks import rehearse, rehearse_plan
from benchmarks import rehearse_build as build

SMALL = (5, 128, 128)  # frames, height, width: 2 latent frames of 8 x 8


@pytest.fixture(scope="module")
def single() -> dict:
    return rehearse.part_single("edge", *SMALL)


def test_one_cfg_step_keeps_the_request_shapes(single: dict) -> None:
    assert single["latents"] == [1, 48, 2, 8, 8]  # z_dim 48, 4x temporal, 16x spatial
    # vision tokens: 2 latent frames of (8 / 2) x (8 / 2) patches
    assert single["vision_tokens"] == 2 * 4 * 4
    assert single["sequence_length"] == single["und_len"] + single["vision_tokens"]
    assert single["latents_after_step"] == "torch.float32"  # the scheduler's sampling dtype
    assert single["video"] == [1, 3, 5, 128, 128]
    assert single["weights_gib"] == pytest.approx((3.37 + 0.705) * 2 / 1.0737, rel=0.01)
    assert 0 < single["step_peak_gib"] < single["weights_gib"]


def test_cfg_ulysses_ranks_send_what_the_layout_says() -> None:
    """cfg=2 x ulysses=4 over 8 fake ranks: each rank runs one of cond / uncond, two
    all-to-alls per layer over its 4 Ulysses peers, and two all-gathers (the sequence and the
    cfg halves); rank 0 and rank 7 sit in different cfg halves."""
    out = rehearse.part_ranks("edge", "cfg=2,ulysses=4", *SMALL, ranks=[0, 7])
    layers = build.load_fixture("edge")["transformer"]["num_hidden_layers"]
    for rank in out["ranks"]:
        ops = rank["collectives"]
        assert ops["alltoall_base_/4"]["calls"] == 2 * layers
        assert ops["allgather_/4"]["calls"] == 1 and ops["allgather_/2"]["calls"] == 1
        assert rank["sent_gib"] > 0
    assert [r["coords"][1] for r in out["ranks"]] == [0, 1]


def test_ring_and_shard_ranks() -> None:
    ring = rehearse.part_ranks("edge", "cfg=2,ring=4", *SMALL, ranks=[0])["ranks"][0]
    assert "send/4" in ring["collectives"] and "alltoall_base_/4" not in ring["collectives"]
    whole = rehearse.part_ranks("edge", "cfg=2,ulysses=4", *SMALL, ranks=[0])["ranks"][0]
    shard = rehearse.part_ranks("edge", "cfg=2,ulysses=4,shard=8", *SMALL,
                                ranks=[0])["ranks"][0]
    # 1/8 of the blocks stay on each rank; embeddings, heads and the VAE stay whole
    assert shard["weights_gib"] < whole["weights_gib"] / 2
    assert "allgather_/8" in shard["collectives"]


def test_full_size_reasoner_prefill_and_static_decode_bf16_and_w8a8() -> None:
    """Nano's reasoner at full size: a prefill chunk and a static decode step, then the same
    with every LLM linear a W8A8 `Fp8Linear` (issue 31 item 1 broke here)."""
    out = rehearse.part_reasoner("nano", prefill_tokens=64)
    vocab = build.load_fixture("nano")["reasoner"]["text_config"]["vocab_size"]
    for arm in ("bf16", "w8a8"):
        assert out[arm]["decode_path"] == "static"
        assert out[arm]["decode_logits"] == [1, vocab]
    assert out["w8a8"]["fp8_linears"] == 36 * 7
    # one byte saved per LLM linear weight: 36 x (q, o 4096^2; k, v 1024 x 4096; 3 MLP 12288 x 4096)
    linear = 36 * (2 * 4096**2 + 2 * 1024 * 4096 + 3 * 12288 * 4096)
    saved = out["bf16"]["weights_gib"] - out["w8a8"]["weights_gib"]
    assert saved == pytest.approx(linear / 2**30, abs=0.002)
    # K and V of 36 layers x 8 heads x 128 in bf16
    assert out["bf16"]["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2


@pytest.mark.parametrize("op", ["linear", "addmm"])
def test_a_dtype_error_fails_the_rehearsal(op: str) -> None:
    """The fake (meta) kernels let a bf16 activation meet a float8 weight; the rehearsal's
    checks raise there as the GPU kernel does (the static decode step's bug, issue 31 item 1:
    `F.linear(h, fp8_weight)`, `torch.addmm(x, a, fp8_weight.mT)`)."""
    with rehearse.new_mode():
        weight = torch.empty(64, 64, dtype=torch.float8_e4m3fn)
        x = torch.empty(4, 64, dtype=torch.bfloat16)
        call = {"linear": lambda: torch.nn.functional.linear(x, weight),
                "addmm": lambda: torch.addmm(x, x, weight.mT)}[op]
        call()  # the fake kernel alone does not see it
        with build.DtypeChecks(), pytest.raises(RuntimeError, match="same dtype"):
            call()


def test_plan_is_compared_for_every_layout(single: dict) -> None:
    out = rehearse_plan.part_plan("edge", ["cfg=2,ulysses=4"], "h100", {"single": single})
    assert out["one_gpu"]["plan_gib"] > 0 and "plan_below" in out["one_gpu"]
    assert out["cfg=2,ulysses=4"]["fits"] is True
    assert any("process groups" in note for note in out["cfg=2,ulysses=4"]["notes"])
    terms = out["one_gpu"]["terms"]  # each term beside its measurement (here a small request)
    assert terms["step_measured_gib"] == round(single["step_peak_gib"], 3)
    assert terms["decode_measured_gib"] == round(single["vae_decode_peak_gib"], 3)
    assert terms["decode_plan_gib"] > terms["step_plan_gib"] > 0 and terms["each_at_or_above"]


def test_cli_parses_the_parallel_layout() -> None:
    assert rehearse.parse_layout("cfg=2,ulysses=4") == {"cfg": 2, "ulysses": 4}
    with pytest.raises(SystemExit):
        rehearse.parse_layout("tensor=2")


def test_collective_bytes_sent_per_rank() -> None:
    """The counter's volumes on a fake 8-rank group: an all-to-all over 4 sends 3/4 of its
    input, an all-gather over 4 sends its input to 3 peers, a ring hop sends its tensor."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from worldserve.levers.parallel.comm import all_gather, all_to_all, ring_shift
    from worldserve.levers.parallel.mesh import ParallelLayout, RankMesh

    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    try:
        mesh = RankMesh(ParallelLayout(cfg=2, ulysses=4), 0)
        mesh.build(60.0)
        x = torch.zeros(4, 256, dtype=torch.bfloat16)  # 2 KiB
        counter = build.CollectiveCounter()
        with counter:
            all_to_all(x, mesh.ulysses)
            all_gather(x, mesh.ulysses)
            ring_shift(x, mesh.sp)
    finally:
        dist.destroy_process_group()
    ops = counter.ops
    assert ops["alltoall_base_/4"] == {"calls": 1, "bytes_sent": 2048 * 3 // 4}
    assert ops["allgather_/4"] == {"calls": 1, "bytes_sent": 2048 * 3}
    assert ops["send/4"] == {"calls": 1, "bytes_sent": 2048}
    assert counter.bytes_sent == 1536 + 6144 + 2048
