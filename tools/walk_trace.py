"""The call tracer behind `tools/request_walks.py`: which worldserve files a request enters,
in order, told apart by the asyncio task (or thread) that ran them.

A *hop* is a call into a function of `worldserve/` whose nearest calling `worldserve/` frame
lies in another file. Resumed coroutines and generators are not calls (their frame was seen
before). Calls made by nothing in `worldserve/` (a task's first frame) are *entries*.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import worldserve

PACKAGE = Path(worldserve.__file__).resolve().parent
ROOT = str(PACKAGE) + "/"
RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


@dataclass(frozen=True)
class Place:
    """A function of worldserve: its file relative to the package parent, and its name."""

    file: str
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.function}"


@dataclass(frozen=True)
class Hop:
    """One call into `callee`; `caller` is None for an entry (a task's first frame)."""

    lane: str
    caller: Place | None
    callee: Place


def place_of(frame: FrameType) -> Place:
    code = frame.f_code
    return Place("worldserve/" + code.co_filename[len(ROOT):], code.co_qualname)


def _in_package(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(ROOT)


@dataclass
class Tracer:
    """Records hops while installed; `lane` names the main task's current phase."""

    lane: str = "setup"
    recording: bool = False
    hops: list[Hop] = field(default_factory=list)
    _resumable: dict[int, FrameType] = field(default_factory=dict)

    def install(self) -> None:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def trace(self, lane: str) -> None:
        """Record from now on, under phase `lane`."""
        self.lane, self.recording = lane, True

    def stop(self) -> None:
        self.recording = False

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.recording or not _in_package(frame):
            return
        if frame.f_code.co_flags & RESUMABLE:
            if id(frame) in self._resumable and self._resumable[id(frame)] is frame:
                return  # a coroutine or generator resumed, not called
            self._resumable[id(frame)] = frame
        caller = frame.f_back
        while caller is not None and not _in_package(caller):
            caller = caller.f_back
        callee = place_of(frame)
        if caller is None:
            self.hops.append(Hop(self._lane(), None, callee))
        elif caller.f_code.co_filename != frame.f_code.co_filename:
            self.hops.append(Hop(self._lane(), place_of(caller), callee))

    def _lane(self) -> str:
        """`task <file>:<coroutine>` for a task that worldserve started; the current phase for
        the request's own task (started by the server framework or the tool)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a worker thread (no running loop)
            return self.lane
        code = getattr(task.get_coro(), "cr_code", None) if task is not None else None
        if code is None or not code.co_filename.startswith(ROOT):
            return self.lane
        return f"task `{code.co_filename[len(ROOT):]}:{code.co_qualname}`"
