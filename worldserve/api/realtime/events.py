"""Validate client `event` messages and apply them to a session's controls (§3.2-3.5).

Every part of an event is validated before anything is applied, so an invalid event (or an
invalid part of a `composite_input`) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from worldserve.api.realtime.controls import SessionControls
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
        handler = self._handlers().get(event.kind)
        if handler is None:
            raise InvalidEvent(f"unknown event kind {event.kind!r}; expected one of "
                               f"{', '.join(EVENT_KINDS)}")
        commit = handler(event.payload)
        commit(self.controls.tag(event.event_id))

    def _handlers(self) -> dict[str, Callable[[Any], Callable]]:
        return {"camera_actions": self._camera, "action": self._action,
                "prompt": self._prompt, "composite_input": self._composite}

    def _require_camera(self) -> None:
        if not self.camera_supported:
            raise InvalidEvent("this model has no camera conditioning; camera events are "
                               "not supported")

    def _camera(self, payload: Any) -> Callable:
        """Validate a script or state payload; return the function that applies it."""
        self._require_camera()
        if isinstance(payload, dict):
            try:
                state = _STATE.validate_python(payload)
            except ValidationError as exc:
                raise InvalidEvent(f"camera_actions state: {_short(exc)}") from None
            transitions = [list(t.actions) for t in state.transitions]
            return lambda tag: self.controls.camera.add_transitions(transitions, tag)
        try:
            script = _SCRIPT.validate_python(payload)
        except ValidationError as exc:
            raise InvalidEvent(f"camera_actions script: {_short(exc)}") from None
        return self._script_commit(script)

    def _script_commit(self, script: list[list[str]]) -> Callable:
        if len(script) > self.max_script_frames:
            raise InvalidEvent(f"camera script has {len(script)} frames; the limit is "
                               f"{self.max_script_frames}")
        return lambda tag: self.controls.camera.set_script(script, tag)

    def _action(self, payload: Any) -> Callable:
        self._require_camera()
        if not isinstance(payload, str):
            raise InvalidEvent("action: payload must be a DSL string like 'w-20,d-10,none-5'")
        try:
            script = parse_action_dsl(payload, self.max_script_frames)
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
        return self._script_commit(script)

    def _prompt(self, payload: Any) -> Callable:
        if isinstance(payload, str):
            if not payload.strip():
                raise InvalidEvent("prompt: must be a non-empty string")
            prompt, refresh = payload, self.default_refresh_kv
        else:
            try:
                parsed = _PROMPT.validate_python(payload)
            except ValidationError as exc:
                raise InvalidEvent(f"prompt: {_short(exc)}") from None
            prompt = parsed.prompt
            refresh = self.default_refresh_kv if parsed.refresh_kv is None else parsed.refresh_kv
        return lambda tag: self.controls.set_prompt(prompt, refresh, tag)

    def _composite(self, payload: Any) -> Callable:
        try:
            composite = _COMPOSITE.validate_python(payload)
        except ValidationError as exc:
            raise InvalidEvent(f"composite_input: {_short(exc)}") from None
        commits = []
        if "camera_actions" in composite.input_types:
            commits.append(self._camera(composite.camera_actions))
        if "prompt" in composite.input_types:
            commits.append(self._prompt(composite.prompt))

        def commit_all(tag: Any) -> None:
            for commit in commits:
                commit(tag)

        return commit_all
