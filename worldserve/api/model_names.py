"""Served model names: `/v1/models` entries, the aliases `--served-model-name` adds, and the
one answer every route gives for a model this server does not serve (404, `The model '<id>'
does not exist; this server serves ...`)."""

from __future__ import annotations

from worldserve.api.runtime import ServerRuntime
from worldserve.errors import NotFound
from worldserve.ipc.capabilities import GenerationCapabilities, ReasonerCapabilities
from worldserve.ipc.messages import StageInfo

# What each stage's model serves, for /v1/models (spec streaming-reasoning.md section 3.3).
STAGE_CAPABILITIES = {"generation": ["images", "videos", "infer"],
                      "reasoner": ["chat_completions", "responses"],
                      "realtime": ["realtime_video"]}


def model_capabilities(runtime: ServerRuntime, stage: str) -> list[str]:
    info = runtime.clients[stage].info
    caps = info.capabilities if info is not None else None
    out = list(STAGE_CAPABILITIES.get(stage, []))
    if isinstance(caps, GenerationCapabilities) and (caps.actions is not None
                                                     or caps.action_generation is not None):
        out.append("actions")
    enabled = runtime.config.stages.reasoner.streaming.enabled
    if isinstance(caps, ReasonerCapabilities) and caps.streaming and enabled:
        out.insert(0, "streaming_reasoning")
    return out


def max_model_len(info: StageInfo) -> int | None:
    caps = info.capabilities
    return caps.max_model_len if isinstance(caps, ReasonerCapabilities) else None


def model_entries(runtime: ServerRuntime, stages: tuple[str, ...] | None = None,
                  first: str | None = None) -> list[dict]:
    """One entry per served model (stages serving the same model, e.g. a Cosmos3 directory's
    generator and reasoner, share it): what it serves, across those stages. The model of stage
    `first` leads (clients take `data[0]`)."""
    entries: dict[str, dict] = {}
    order = sorted(runtime.clients.items(), key=lambda item: item[0] != first)
    for stage, client in order:
        if client.info is None or (stages is not None and stage not in stages):
            continue
        entry = entries.setdefault(client.info.model, {
            "id": client.info.model, "object": "model", "created": int(runtime.started_at),
            "owned_by": "worldserve", "stage": stage,
            "root": runtime.public_path(client.info.model_path, client.info.model),
            "stages": [], "max_model_len": None, "capabilities": []})
        entry["stages"].append(stage)
        entry["max_model_len"] = entry["max_model_len"] or max_model_len(client.info)
        entry["capabilities"] += [c for c in model_capabilities(runtime, stage)
                                  if c not in entry["capabilities"]]
    return list(entries.values())


def listed_name(runtime: ServerRuntime, model_id: str) -> str:
    """The listed id an alias given by `--served-model-name` stands for; any other name as is."""
    names = runtime.config.served_model_names
    return names[0] if model_id in names[1:] else model_id


def served_model(runtime: ServerRuntime, model_id: str,
                 stages: tuple[str, ...] | None = None) -> dict:
    """The entry of `model_id` (or of the listed name it is an alias of, `--served-model-name`),
    else the 404 every route gives for an unknown model."""
    entries = model_entries(runtime, stages)
    model_id = listed_name(runtime, model_id)
    for entry in entries:
        if entry["id"] == model_id:
            return entry
    names = ", ".join(repr(e["id"]) for e in entries) or "none"
    raise NotFound(f"The model '{model_id}' does not exist; this server serves {names}",
                   param="model")


