"""Control queues of one session (spec realtime-video §3.2-3.5), sampled once per chunk.

Camera control has two mutually exclusive modes (installing one clears the other):
- script: one key list per output frame, consumed FIFO across chunks, padded with [];
  bounded at `max_script_frames` (a longer script is rejected by the caller);
- state: level-triggered held keys fed by transitions. Overflow policy of the transition
  queue: at most `MAX_PENDING_TRANSITIONS`; beyond it the oldest are dropped.
Prompt control keeps only the latest pending prompt (a newer one replaces it).

Each control remembers the `event_id` and an arrival sequence number of the event that
installed it, so a chunk reports the id of the most recent event it used.

An event reaches the controls as validated `ControlUpdate`s (`SessionControls.apply`); the
generate loop takes them out once per chunk (`SessionControls.next_chunk`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

MAX_PENDING_TRANSITIONS = 512


@dataclass(frozen=True)
class Tagged:
    """Where a control came from: the event's id (None when the client gave none) and order."""

    event_id: int | None
    seq: int


@dataclass(frozen=True)
class CameraSample:
    camera: list[list[str]] | None
    source: Tagged | None


class CameraControl:
    """Script and state modes of §3.3."""

    def __init__(self, min_pulse_items: int, max_script_frames: int) -> None:
        self.min_pulse_items = max(1, min_pulse_items)
        self.max_script_frames = max_script_frames
        self.mode: str | None = None  # None, "script" or "state"
        self._script: collections.deque[tuple[list[str], Tagged]] = collections.deque()
        self._transitions: collections.deque[tuple[list[str], Tagged]] = collections.deque(
            maxlen=MAX_PENDING_TRANSITIONS)
        self._held: tuple[list[str], Tagged] | None = None

    @property
    def num_script_frames(self) -> int:
        return len(self._script)

    def set_script(self, frames: list[list[str]], source: Tagged) -> None:
        """Replace the unconsumed rest of any script; leaves state mode."""
        if len(frames) > self.max_script_frames:
            raise ValueError(f"camera script has {len(frames)} frames; the limit is "
                             f"{self.max_script_frames}")
        self.mode = "script"
        self._transitions.clear()
        self._held = None
        self._script = collections.deque((list(keys), source) for keys in frames)

    def add_transitions(self, transitions: list[list[str]], source: Tagged) -> None:
        """Queue held-key transitions; leaves script mode (the oldest drop past the bound)."""
        if self.mode != "state":
            self.mode = "state"
            self._script.clear()
        self._transitions.extend((list(keys), source) for keys in transitions)

    def sample(self, num_frames: int) -> CameraSample:
        if self.mode == "script":
            return self._sample_script(num_frames)
        if self.mode == "state":
            return self._sample_state(num_frames)
        return CameraSample(None, None)

    def _sample_script(self, num_frames: int) -> CameraSample:
        camera: list[list[str]] = []
        source = None
        while self._script and len(camera) < num_frames:
            keys, source = self._script.popleft()
            camera.append(keys)
        camera.extend([] for _ in range(num_frames - len(camera)))
        return CameraSample(camera, source)

    def _sample_state(self, num_frames: int) -> CameraSample:
        drained = list(self._transitions)
        self._transitions.clear()
        if not drained:
            if self._held is None:
                return CameraSample(None, None)
            keys, source = self._held
            return CameraSample([list(keys) for _ in range(num_frames)], source)
        final_keys, final_source = drained[-1]
        self._held = (final_keys, final_source)
        pulse = next((t for t in reversed(drained)
                      if t[0] and sorted(t[0]) != sorted(final_keys)), None)
        if pulse is None:
            return CameraSample([list(final_keys) for _ in range(num_frames)], final_source)
        pulse_len = min(self.min_pulse_items, num_frames)
        camera = [list(pulse[0]) for _ in range(pulse_len)]
        camera += [list(final_keys) for _ in range(num_frames - pulse_len)]
        return CameraSample(camera, pulse[1] if pulse_len == num_frames else final_source)


@dataclass(frozen=True)
class ScriptUpdate:
    """Script mode: one key list per output frame (an `action` DSL string, expanded)."""

    frames: list[list[str]]


@dataclass(frozen=True)
class StateUpdate:
    """State mode: held-key transitions."""

    transitions: list[list[str]]


@dataclass(frozen=True)
class PromptUpdate:
    prompt: str
    refresh_kv: bool


ControlUpdate = ScriptUpdate | StateUpdate | PromptUpdate


@dataclass(frozen=True)
class PendingPrompt:
    prompt: str
    refresh_kv: bool
    source: Tagged


@dataclass(frozen=True)
class ChunkControls:
    """What the next chunk uses: camera keys per frame, a prompt switch, the event id."""

    camera: list[list[str]] | None
    prompt: str | None
    refresh_kv: bool
    event_id: int | None


class SessionControls:
    """Camera + prompt controls of one session; `next_chunk()` samples them at a boundary."""

    def __init__(self, min_pulse_items: int, max_script_frames: int) -> None:
        self.camera = CameraControl(min_pulse_items, max_script_frames)
        self._pending_prompt: PendingPrompt | None = None
        self._seq = 0

    def tag(self, event_id: int | None) -> Tagged:
        self._seq += 1
        return Tagged(event_id, self._seq)

    def apply(self, updates: list[ControlUpdate], event_id: int | None) -> None:
        """Install the validated updates of one event (all under the event's tag)."""
        source = self.tag(event_id)
        for update in updates:
            if isinstance(update, ScriptUpdate):
                self.camera.set_script(update.frames, source)
            elif isinstance(update, StateUpdate):
                self.camera.add_transitions(update.transitions, source)
            else:
                self._pending_prompt = PendingPrompt(update.prompt, update.refresh_kv, source)

    def next_chunk(self, num_frames: int) -> ChunkControls:
        sample = self.camera.sample(num_frames)
        prompt, self._pending_prompt = self._pending_prompt, None
        sources = [s for s in (sample.source, prompt.source if prompt else None)
                   if s is not None and s.event_id is not None]
        event_id = max(sources, key=lambda s: s.seq).event_id if sources else None
        return ChunkControls(
            camera=sample.camera,
            prompt=prompt.prompt if prompt else None,
            refresh_kv=prompt.refresh_kv if prompt else False,
            event_id=event_id,
        )
