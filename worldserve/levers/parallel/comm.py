"""The collectives a rank group uses, each failing with `CollectiveError` instead of hanging.

The process group is created with a timeout (`parallel.timeout_s`), so a collective whose peer
died (connection closed) or hangs (timeout) raises; these wrappers turn whatever the backend
raised into one exception type the rank runtime recognises as "the group is broken". On NCCL
(unverified: no GPU ran it) a ring hop waits on the stream, not the host: there the group's
timeout is enforced by NCCL's watchdog and a dead peer by the rank group's peer watch.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

from worldserve.levers.parallel.mesh import GroupHandle

T = TypeVar("T")


class CollectiveError(RuntimeError):
    """A collective failed or timed out: a peer rank died, hung or diverged."""


@contextmanager
def _failing_as(op: str, handle: GroupHandle) -> Iterator[None]:
    try:
        yield
    except CollectiveError:
        raise
    except RuntimeError as exc:  # DistBackendError, DistNetworkError, gloo/NCCL errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CollectiveError(f"{op} over ranks {handle.ranks} failed: {first}") from exc


def _run(op: str, handle: GroupHandle, fn: Callable[[], T]) -> T:
    with _failing_as(op, handle):
        return fn()


def all_gather(tensor: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """(size, *tensor.shape): every rank's `tensor` (same shape on every rank), in axis order."""
    import torch.distributed as dist

    if handle.size == 1:
        return tensor.unsqueeze(0)
    tensor = tensor.contiguous()
    out = torch.empty((handle.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    _run("all_gather", handle,
         lambda: dist.all_gather(list(out.unbind(0)), tensor, group=handle.group))
    return out


def all_gather_cat(tensor: torch.Tensor, handle: GroupHandle, dim: int = 0) -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim` in axis order."""
    gathered = all_gather(tensor, handle)
    return torch.cat(list(gathered.unbind(0)), dim=dim) if handle.size > 1 else tensor


def all_to_all(tensor: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """`tensor` is (size, ...): slice i goes to rank i; returns (size, ...) with slice j from
    rank j."""
    import torch.distributed as dist

    if handle.size == 1:
        return tensor
    tensor = tensor.contiguous()
    out = torch.empty_like(tensor)
    _run("all_to_all", handle,
         lambda: dist.all_to_all_single(out, tensor, group=handle.group))
    return out


class PendingShift:
    """A ring hop under way (`ring_shift_start`): `wait()` gives the previous rank's tensor."""

    def __init__(self, works: list, out: torch.Tensor, handle: GroupHandle) -> None:
        self._works, self._out, self._handle = works, out, handle

    def wait(self) -> torch.Tensor:
        """On the CPU (gloo) the host waits, at most `timeout_s`. On CUDA (NCCL) the current
        stream waits for the exchange and the host goes on: a wait with a timeout would block
        the host once per hop; a dead peer is caught by the rank group's peer watch and NCCL's
        own watchdog (the group's timeout) instead (docs/parallel.md, failures; unverified: no
        GPU ran it)."""
        timeout = datetime.timedelta(seconds=self._handle.timeout_s)
        with _failing_as("ring send/recv", self._handle):
            for work in self._works:
                if self._out.device.type == "cuda":
                    work.wait()
                else:
                    work.wait(timeout)
        return self._out


def ring_shift_start(tensor: torch.Tensor, handle: GroupHandle) -> PendingShift:
    """Start sending `tensor` to the next rank of the ring and receiving the previous rank's;
    compute may run meanwhile (the send reads `tensor`: leave it unchanged until `wait`)."""
    import torch.distributed as dist

    if handle.size == 1:
        return PendingShift([], tensor, handle)
    tensor = tensor.contiguous()
    out = torch.empty_like(tensor)
    nxt = handle.ranks[(handle.index + 1) % handle.size]
    prv = handle.ranks[(handle.index - 1) % handle.size]
    ops = [dist.P2POp(dist.isend, tensor, nxt, group=handle.group),
           dist.P2POp(dist.irecv, out, prv, group=handle.group)]
    works = _run("ring send/recv", handle, lambda: dist.batch_isend_irecv(ops))
    return PendingShift(list(works), out, handle)


def ring_shift(tensor: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """Send `tensor` to the next rank of the ring, receive the previous rank's."""
    return ring_shift_start(tensor, handle).wait()
