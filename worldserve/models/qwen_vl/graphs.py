"""Captured static decode steps (`stages.reasoner.cuda_graphs`; unverified: no GPU ran it).

A decode step launches a few hundred small kernels; on a GPU the host's launching, not the
arithmetic, sets its time. A CUDA graph records the launches of one step once and replays
them with one call. `StaticDecoder.forward` is written for that: it reads nothing back, makes
no tensor from Python data, and with `full_buffers` its shapes depend only on the batch size,
the width (tokens fed per sequence) and the buffers' capacity. What a replay cannot change is
addresses, so a graph belongs to one set of K/V buffers: the key is (batch, width, every
layer's K and V buffer: address and shape). A session's buffers move when they grow (capacity
doubles) and a packed batch's when it re-packs: the next step captures again, at most
`max_graphs` kept (least recently used dropped). Two sessions never share a graph, except
one whose buffers sit at exactly the addresses and shapes of a freed one's, where replaying
writes exactly those buffers: the same step.

Replay: the step's integers (`_host_plan`) are copied into the graph's static input, the graph
replays, and the logits are copied out of its static output (the next replay overwrites it).

`cuda_capture` is the CUDA path: a warm-up run on a side stream (cuBLAS and the allocator set
up outside the capture; it writes the same K/V at the same rows as the replay, so running the
step twice changes nothing), then `torch.cuda.graph`. `rerun_capture` is what runs on the CPU
(and in the tests): the same static input and output and the same keys, replayed by running
the step again, with no speed-up. DFlash's forward hooks are Python a replay would not run:
with hooks on a decoder layer the decoder does not use its graphs (`StaticDecoder.hooked`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MAX_GRAPHS = 16  # captured steps kept per decoder (each holds its own activation memory)
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], Any], torch.Tensor]]
# StaticDecoder.forward: (plan, buffers, batch, width, longest) -> (B, W, V) logits
Forward = Callable[[torch.Tensor, list[torch.Tensor], int, int, int], torch.Tensor]


def cuda_capture(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], Any], torch.Tensor]:
    """(replay, static output) of `fn` recorded as a CUDA graph (unverified: no GPU ran it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def rerun_capture(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], Any], torch.Tensor]:
    """The CPU's stand-in: the first run's output is the static output; a replay runs `fn`
    again into it."""
    out = fn()
    return (lambda: out.copy_(fn())), out


@dataclass
class _Graph:
    plan: torch.Tensor  # the static input: `_host_plan`'s integers on the device
    replay: Callable[[], Any]
    out: torch.Tensor  # the static output: (B, W, V) logits


class StepGraphs:
    """The captured steps of one decoder (module doc)."""

    def __init__(self, capture: Capture, max_graphs: int = MAX_GRAPHS) -> None:
        self.capture = capture
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.captures = 0  # steps captured so far (stats, tests)
        self.replays = 0

    @classmethod
    def for_device(cls, device: torch.device) -> StepGraphs:
        return cls(cuda_capture if device.type == "cuda" else rerun_capture)

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, forward: Forward, buffers: list[torch.Tensor], batch: int, width: int,
            host: torch.Tensor) -> torch.Tensor:
        """(B, W, V) logits of the step whose integers are `host`, replayed from its graph
        (captured first when there is none for these buffers)."""
        key = (batch, width, *((t.data_ptr(), *t.shape) for t in buffers))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(forward, buffers, batch, width, host)
            self._graphs[key] = graph
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
            graph.plan.copy_(host, non_blocking=True)  # pinned on CUDA (_host_plan)
        graph.replay()
        self.replays += 1
        return graph.out.clone()

    def _capture(self, forward: Forward, buffers: list[torch.Tensor], batch: int, width: int,
                 host: torch.Tensor) -> _Graph:
        plan = host.to(buffers[0].device)  # the replays copy into it
        bound = list(buffers)  # these tensors, as a graph holds these addresses

        def step() -> torch.Tensor:  # full buffers: the attended length is their capacity
            return forward(plan, bound, batch, width, 0)

        replay, out = self.capture(step)
        self.captures += 1
        # a CUDA graph keeps addresses, not tensors: the buffers are freed as usual (the CPU's
        # rerun keeps `step`, and so them, until the graph is dropped)
        return _Graph(plan, replay, out)
