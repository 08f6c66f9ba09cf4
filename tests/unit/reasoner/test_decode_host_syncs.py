"""A decode step does not wait for the device (issue 31 item 7), counted on the CPU.

On a GPU, reading a tensor's value into Python (`item`, `bool`, `int`, `tolist`, `.cpu()`)
waits for every kernel queued before it, and a tensor made from Python data (`torch.tensor`,
a Python number assigned into a tensor) is a host-to-device copy, which from pageable memory
waits too. `HostTraffic` counts both kinds of call on the CPU, where every tensor is a host
tensor: so the step keeps its own bookkeeping in Python ints. What a step may do: the static
step reads nothing and makes one tensor (the fed tokens with their positions and lengths, one
copy); the sampler reads once (the sampled tokens) and makes nothing after a batch's first
step. The tokens themselves are held equal elsewhere: test_decode_paths.py (static step =
transformers' forward; device sampler = the scalar sampler), test_sampling.py.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from worldserve.engines.reasoner.decoding import ReplyDecoder
from worldserve.engines.reasoner.execute import DecodeRow, StepRunner
from worldserve.engines.reasoner.sampling import NUCLEUS_PRECUT, sample_rows
from worldserve.ipc.messages import ReasonerSampling
from worldserve.models import registry

STEPS = 4


class _Dispatched(TorchDispatchMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":  # item, bool, int, float
            self.counts["reads"] += 1
        elif name == "lift_fresh":  # torch.tensor(data), a Python number assigned in
            self.counts["made"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_traffic(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    """Counts `reads` (values into Python) and `made` (tensors from Python data) while open.
    `tolist`, `cpu` and `numpy` do not dispatch: they are wrapped instead."""
    counts: Counter = Counter()

    def counted(original):
        def wrapper(self, *args, **kwargs):
            counts["reads"] += 1
            return original(self, *args, **kwargs)
        return wrapper

    with monkeypatch.context() as patch:
        for name in ("tolist", "cpu", "numpy"):
            patch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
        with _Dispatched(counts):
            yield counts


def test_the_counter_sees_each_kind_of_host_traffic(monkeypatch):
    t = torch.arange(4)
    with host_traffic(monkeypatch) as counts:
        bool(t.any()), int(t.max()), t.sum().item(), t.tolist(), t.cpu()
        torch.tensor([1, 2])
        t[1] = 5
    assert counts == {"reads": 5, "made": 2}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "cosmos3_omni"])
def runner(request, tiny_dir, tiny_qwen3_dir, tmp_path_factory):
    if request.param == "cosmos3_omni":
        from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

        model_dir = tmp_path_factory.mktemp("omni")
        write_reasoner_files(model_dir, 0, "cosmos3_omni")
    else:
        model_dir = {"qwen2_5_vl": tiny_dir, "qwen3_vl": tiny_qwen3_dir}[request.param]
    loaded = registry.load_runner("reasoner", model_dir)
    assert loaded.configure_decode(True) == "static"
    return loaded


def _prefilled(runner, num_sequences: int) -> list:
    kvs = [runner.new_kv() for _ in range(num_sequences)]
    for b, kv in enumerate(kvs):
        runner.forward(kv, list(range(10 + b, 20 + 3 * b)))
    return kvs


@pytest.mark.parametrize("num_sequences,width", [(1, 1), (1, 3), (3, 1), (3, 2)])
def test_a_static_step_reads_nothing_and_uploads_once(runner, monkeypatch, num_sequences,
                                                      width):
    """One sequence or a packed batch, one token or a token and drafts: per step no read and
    one tensor from Python data (the step's integers, one host-to-device copy)."""
    kvs = _prefilled(runner, num_sequences)
    fed = [[7 + b] * width for b in range(num_sequences)]
    runner.forward_decode_batch(kvs, fed)  # packs the batch (once per batch, not per token)
    forwards = runner.num_forwards
    with host_traffic(monkeypatch) as counts:
        for _ in range(STEPS):
            runner.forward_decode_batch(kvs, fed)
    assert runner.num_forwards == forwards + STEPS  # each step took the static path
    assert counts == {"made": STEPS}


MIXED = [dict(temperature=0.0), dict(temperature=0.7, top_k=20, top_p=0.9, seed=1),
         dict(temperature=1.0, top_p=1.0, seed=2, frequency_penalty=0.5)]


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _rows(runner, kvs, settings: list[dict]) -> list[DecodeRow]:
    rows = []
    for kv, knobs in zip(kvs, settings):
        sampling = ReasonerSampling(max_tokens=1000, repetition_penalty=1.1, **knobs)
        generator = torch.Generator(runner.device).manual_seed(knobs.get("seed", 0))
        decoder = ReplyDecoder(sampling, kv.ids, {1}, _Tokenizer(), runner.vocab_size,
                               generator, banned_ids=(5, 6), device=runner.device)
        rows.append(DecodeRow(kv, 7, decoder))
    return rows


@pytest.mark.parametrize("settings", [[MIXED[0]], [MIXED[1]], MIXED], ids=[
    "greedy", "top_k_top_p", "mixed"])
def test_a_decode_step_reads_its_tokens_once(runner, monkeypatch, settings):
    """Forward, sampler, acceptance: one read per step (the sampled tokens) and one tensor
    from Python data (the forward's). A top-k row's nucleus lies inside the pre-cut."""
    kvs = _prefilled(runner, len(settings))
    rows = _rows(runner, kvs, settings)
    steps = StepRunner(runner, proposer=None)
    for row, token in zip(rows, steps.decode(rows)):  # the batch's first step
        row.pending = token
    with host_traffic(monkeypatch) as counts:
        for _ in range(STEPS):
            for row, token in zip(rows, steps.decode(rows)):
                row.pending = token
    assert counts == {"reads": STEPS, "made": STEPS}


def test_a_nucleus_past_the_pre_cut_costs_a_second_read(monkeypatch):
    """The rare case: a flat row's nucleus holds more than NUCLEUS_PRECUT tokens, so its draw
    is redone from the full sort (same noise) after the first read."""
    vocab = 4 * NUCLEUS_PRECUT
    sampling = ReasonerSampling(max_tokens=10, temperature=1.0, top_p=0.9)
    decoder = ReplyDecoder(sampling, [], {1}, _Tokenizer(), vocab, torch.Generator())
    with host_traffic(monkeypatch) as counts:
        sample_rows([decoder], torch.zeros(1, vocab))
    assert counts == {"reads": 2}
