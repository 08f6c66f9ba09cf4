"""Validate client `event` messages and apply them to a session's controls (§3.2-3.5).

An event becomes a list of validated `ControlUpdate`s (an `action` DSL string: one
`ScriptUpdate`), which `SessionControls.apply` installs. Every part of an event is validated
before anything is applied, so an invalid event (or an invalid part of a `composite_input`)
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from worldserve.api.realtime.controls import (
    ControlUpdate,
    PromptUpdate,
    ScriptUpdate,
    SessionControls,
    StateUpdate,
)
from worldserve.api.schemas.realtime import (
    CameraKey,
    CompositePayload,
    EventMessage,
    PromptPayload,
    StatePayload,
    parse_action_dsl,
)

_SCRIPT = TypeAdapter(list[list[CameraKey]])
_STATE = TypeAdapter(StatePayload)
_PROMPT = TypeAdapter(PromptPayload)
_COMPOSITE = TypeAdapter(CompositePayload)
EVENT_KINDS = ("camera_actions", "prompt", "composite_input", "action", "heartbeat")


class InvalidEvent(ValueError):
    """An event that fails validation; the message is the `detail` sent to the client."""


def _short(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


def parse_event(message: Any) -> EventMessage:
    if not isinstance(message, dict) or message.get("type") != "event":
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise InvalidEvent(f"expected a map with type 'event', got {kind!r}")
    try:
        return EventMessage.model_validate(message)
    except ValidationError as exc:
        raise InvalidEvent(_short(exc)) from None


@dataclass
class EventApplier:
    """Applies validated events of one session. `camera_supported`: the model takes camera keys."""

    controls: SessionControls
    camera_supported: bool
    max_script_frames: int
    default_refresh_kv: bool

    def apply(self, event: EventMessage) -> None:
        """Raise InvalidEvent, or apply the whole event. Heartbeats change nothing here."""
        if event.kind == "heartbeat":
            return
        self.controls.apply(self.updates(event.kind, event.payload), event.event_id)

    def updates(self, kind: str, payload: Any) -> list[ControlUpdate]:
        """The validated control updates of one event (InvalidEvent: none)."""
        if kind == "action":
            return [self._action(payload)]
        if kind == "camera_actions":
            return [self._camera(payload)]
        if kind == "prompt":
            return [self._prompt(payload)]
        if kind == "composite_input":
            return self._composite(payload)
        raise InvalidEvent(f"unknown event kind {kind!r}; expected one of {', '.join(EVENT_KINDS)}")

    def _require_camera(self) -> None:
        if not self.camera_supported:
            raise InvalidEvent("this model has no camera conditioning; camera events are "
                               "not supported")

    def _action(self, payload: Any) -> ScriptUpdate:
        self._require_camera()
        if not isinstance(payload, str):
            raise InvalidEvent("action: payload must be a DSL string like 'w-20,d-10,none-5'")
        try:
            script = parse_action_dsl(payload, self.max_script_frames)
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
        return self._script(script)

    def _camera(self, payload: Any) -> ScriptUpdate | StateUpdate:
        """A script (a list of key lists) or a state payload (a map of transitions)."""
        self._require_camera()
        if isinstance(payload, dict):
            try:
                state = _STATE.validate_python(payload)
            except ValidationError as exc:
                raise InvalidEvent(f"camera_actions state: {_short(exc)}") from None
            return StateUpdate([list(t.actions) for t in state.transitions])
        try:
            script = _SCRIPT.validate_python(payload)
        except ValidationError as exc:
            raise InvalidEvent(f"camera_actions script: {_short(exc)}") from None
        return self._script(script)

    def _script(self, script: list[list[str]]) -> ScriptUpdate:
        if len(script) > self.max_script_frames:
            raise InvalidEvent(f"camera script has {len(script)} frames; the limit is "
                               f"{self.max_script_frames}")
        return ScriptUpdate(script)

    def _prompt(self, payload: Any) -> PromptUpdate:
        if isinstance(payload, str):
            if not payload.strip():
                raise InvalidEvent("prompt: must be a non-empty string")
            return PromptUpdate(payload, self.default_refresh_kv)
        try:
            parsed = _PROMPT.validate_python(payload)
        except ValidationError as exc:
            raise InvalidEvent(f"prompt: {_short(exc)}") from None
        refresh = self.default_refresh_kv if parsed.refresh_kv is None else parsed.refresh_kv
        return PromptUpdate(parsed.prompt, refresh)

    def _composite(self, payload: Any) -> list[ControlUpdate]:
        try:
            composite = _COMPOSITE.validate_python(payload)
        except ValidationError as exc:
            raise InvalidEvent(f"composite_input: {_short(exc)}") from None
        updates: list[ControlUpdate] = []
        if "camera_actions" in composite.input_types:
            updates.append(self._camera(composite.camera_actions))
        if "prompt" in composite.input_types:
            updates.append(self._prompt(composite.prompt))
        return updates
