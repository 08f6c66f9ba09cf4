"""Captured static decode steps (`cuda_graphs`, models/qwen_vl/graphs.py) on the CPU, where a
replay reruns the captured step (`rerun_capture`): the same static input, static output and
keys as on CUDA. Replayed steps equal the static step (one sequence and packed batches, drafts,
a rejected draft, buffers that grow); a graph is replayed while its buffers stay and captured
again when they move; the captured forward reads nothing back and makes no tensor from Python
data (what a capture requires); hooked layers (DFlash) keep the uncaptured step. The CUDA
capture itself (`cuda_capture`) has not run: no GPU was lent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.drive import concurrent_replies, windowed_greedy_replies
from tests.unit.reasoner.test_decode_host_syncs import host_traffic
from tests.unit.reasoner.test_decode_paths import _engine, _prefilled
from worldserve.config import ReasonerStageConfig
from worldserve.models import registry
from worldserve.models.qwen_vl.graphs import StepGraphs, rerun_capture


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "cosmos3_omni"])
def model_dir(request, tiny_dir, tiny_qwen3_dir, tmp_path_factory) -> Path:
    if request.param == "cosmos3_omni":
        from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

        made = tmp_path_factory.mktemp("omni")
        write_reasoner_files(made, 0, "cosmos3_omni")
        return made
    return {"qwen2_5_vl": tiny_dir, "qwen3_vl": tiny_qwen3_dir}[request.param]


def _runner(model_dir: Path, graphs: bool):
    runner = registry.load_runner("reasoner", model_dir)
    assert runner.configure_decode(True, graphs=graphs) == ("static, graphs" if graphs
                                                            else "static")
    return runner


def test_replayed_steps_equal_the_static_step(model_dir):
    """One sequence, then packed batches with uneven draft widths and a member leaving, a
    rejected draft after each step, and enough steps that the buffers grow."""
    captured, plain = _runner(model_dir, True), _runner(model_dir, False)
    long = [5 + (7 * i) % 90 for i in range(240)]  # grows past the first 256-token buffers
    prompts = [long, list(range(20, 31)), [7] * 6]
    ours, ref = _prefilled(captured, prompts), _prefilled(plain, prompts)
    steps = ([[[3]]] * 3 + [[[4, 5, 6]]] * 2 + [[[3], [4, 5, 6], [8, 9]]] * 3
             + [[[10], [12], [13]]] * 3 + [[[14, 15], [16]]] * 2 + [[[11]]] * 12)
    capacities = set()
    for fed in steps:
        n = len(fed)
        got = captured.forward_decode_batch(ours[:n], fed)
        expected = plain.forward_decode_batch(ref[:n], fed)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if len(fed[0]) > 1:  # a rejected draft
            ours[0].truncate(len(ours[0]) - 1)
            ref[0].truncate(len(ref[0]) - 1)
        capacities.add(ours[0].cache.layers[0]._k.shape[-2])
    graphs = captured.static.graphs
    assert graphs.replays == len(steps) and graphs.captures < len(steps) // 2
    assert len(capacities) >= 2  # the single sequence's buffers grew while it was replayed
    for a, b in zip(ours, ref):
        assert a.ids == b.ids and torch.equal(a.positions, b.positions)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            torch.testing.assert_close(la.keys, lb.keys, atol=1e-5, rtol=1e-5)


def test_a_graph_replays_until_its_buffers_move(tiny_dir):
    runner = _runner(tiny_dir, True)
    graphs = runner.static.graphs
    (kv,) = _prefilled(runner, [[5, 9, 13, 2]])
    runner.forward_decode_batch([kv], [[3]])
    assert (graphs.captures, graphs.replays) == (1, 1)
    buffer = kv.cache.layers[0]._k
    while kv.cache.layers[0]._k is buffer:  # steps until the buffers grow
        runner.forward_decode_batch([kv], [[3]])
    replays = graphs.replays
    assert graphs.captures == 2 and replays > 2  # each step before it replayed
    runner.forward_decode_batch([kv], [[3, 4]])  # another width: another graph
    assert graphs.captures == 3
    (other,) = _prefilled(runner, [[5, 9, 13, 2]])  # another session: its own buffers
    runner.forward_decode_batch([other], [[3]])
    assert graphs.captures == 4 and len(graphs) == 4


def test_the_least_recently_used_graph_goes_first(tiny_dir):
    runner = _runner(tiny_dir, True)
    runner.static.graphs = graphs = StepGraphs(rerun_capture, max_graphs=2)
    kvs = _prefilled(runner, [[5, 9], [6, 10], [7, 11]])
    for kv in (kvs[0], kvs[1], kvs[0], kvs[2]):  # kvs[1]'s graph is the oldest when kvs[2] comes
        runner.forward_decode_batch([kv], [[3]])
    assert (graphs.captures, len(graphs)) == (3, 2)
    runner.forward_decode_batch([kvs[0]], [[3]])  # still kept
    assert graphs.captures == 3
    runner.forward_decode_batch([kvs[1]], [[3]])  # dropped: captured again
    assert graphs.captures == 4


def test_the_captured_forward_reads_nothing_and_makes_no_tensor(tiny_dir, monkeypatch):
    """What a CUDA capture requires of the step it records (a read or a host copy during a
    capture fails it): the forward alone reads nothing and makes no tensor; a replayed step
    makes its one tensor of integers."""
    runner = _runner(tiny_dir, True)
    kvs = _prefilled(runner, [[5, 9, 13, 2], list(range(20, 31))])
    runner.forward_decode_batch(kvs, [[3], [4, 5]])  # packs, captures
    graphs = runner.static.graphs
    replays = graphs.replays
    with host_traffic(monkeypatch) as counts:
        runner.forward_decode_batch(kvs, [[3], [4, 5]])
    assert graphs.replays == replays + 1 and counts == {"made": 1}
    static, packed = runner.static, runner.packed
    buffers = static.buffers(packed.kvs, packed)
    plan = torch.tensor([3, 3, 4, 5, 0, 0, 0, 0])  # made before counting
    plan[4:6] = torch.tensor([kv.next_pos for kv in packed.kvs])
    plan[6:] = torch.tensor([len(kv) for kv in packed.kvs])
    with host_traffic(monkeypatch) as counts, torch.inference_mode():
        logits = static.forward(plan, buffers, 2, 2, 0)
    assert logits.shape[:2] == (2, 2) and not counts


def test_hooked_layers_keep_the_uncaptured_step(tiny_dir):
    runner = _runner(tiny_dir, True)
    seen = []
    layer = runner.static.layers[1].module
    handle = layer.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    (kv,) = _prefilled(runner, [[5, 9, 13, 2]])
    seen.clear()
    runner.forward_decode_batch([kv], [[3]])
    assert seen and runner.static.graphs.captures == 0
    handle.remove()
    runner.forward_decode_batch([kv], [[3]])
    assert runner.static.graphs.captures == 1


def test_engine_replies_with_graphs_equal_the_static_step(tiny_dir):
    assert ReasonerStageConfig().cuda_graphs is False
    captured, plain = _engine(tiny_dir, cuda_graphs=True), _engine(tiny_dir)
    assert captured.engine.decode_path == "static, graphs"
    assert windowed_greedy_replies(captured) == windowed_greedy_replies(plain)
    sampled = {"max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 11}
    for sampling in ({"max_tokens": 10, **GREEDY}, sampled):
        drafted = [_engine(tiny_dir, cuda_graphs=graphs, streaming={"spec_method": "ngram"})
                   for graphs in (True, False)]
        assert concurrent_replies(drafted[0], sampling) == concurrent_replies(drafted[1],
                                                                              sampling)
        assert drafted[0].engine.steps.runner.static.graphs.replays > 0


@pytest.mark.parametrize(("stage", "message"), [
    ({"static_decode": False}, "needs static_decode"),
    ({"compile_decode": True}, "choose one")])
def test_graphs_refuse_what_they_cannot_capture(stage, message):
    with pytest.raises(ValidationError, match=message):
        ReasonerStageConfig(cuda_graphs=True, **stage)
