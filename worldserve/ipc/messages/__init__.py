"""Every message that crosses a process boundary, as msgspec Structs.

Encoded as msgpack with a `type` tag (the class name); never pickle. Field order: msgspec
applies `kw_only` per class, so required fields come before fields with defaults. Every class that
subclasses `Message` in this package is decodable (see `all_message_types()`). Sections:
control (all stages), then one section per engine.

Requests carry a `request_id` chosen by the api process; every reply to a request carries the
same id. A request gets exactly one terminal reply (a result or `ErrorReply`); streaming
requests may get non-terminal replies (progress, chunks) before it.

One module per section: `base` (the bases and the control messages all stages answer),
`generation` (media jobs and operator requests), `reasoner`, `realtime`; every name is
re-exported here, so `from worldserve.ipc.messages import X` is the one spelling.
"""

from __future__ import annotations

from worldserve.ipc.capabilities import (  # noqa: F401  (re-exported: session parameters)
    Capabilities,
    ReasonerRetention,
    ReasonerSampling,
)
from worldserve.ipc.messages.base import (  # noqa: F401
    Cancel,
    Echo,
    EchoReply,
    ErrorReply,
    Hello,
    Message,
    Ping,
    Reply,
    Request,
    StageInfo,
    StageState,
    StageStats,
    StageStatus,
    StatsRequest,
)
from worldserve.ipc.messages.generation import (  # noqa: F401
    ActionCondition,
    ActionOutput,
    ActionsResult,
    AdminRequest,
    AdminResult,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationContinue,
    GenerationParams,
    GenerationPause,
    GenerationProgress,
    GenerationResult,
    LoraList,
    LoraLoad,
    LoraRef,
    LoraUnload,
    MemoryRelease,
    MemoryResume,
    ModelInfoRequest,
    StepCacheReport,
    WeightsUpdate,
)
from worldserve.ipc.messages.realtime import (  # noqa: F401
    RealtimeChunk,
    RealtimeChunkResult,
    RealtimeOpen,
    RealtimeOpened,
    RealtimeRelease,
    RealtimeReleased,
)
from worldserve.ipc.messages.reasoner import (  # noqa: F401
    ChatCompletion,
    ChatDelta,
    ChatMessage,
    ChatPart,
    ChatResult,
    CloseSession,
    CreateSession,
    FrameResult,
    SessionClosed,
    SessionCreated,
    SessionFrame,
)


def all_message_types() -> tuple[type[Message], ...]:
    """Every concrete message class (every subclass of Message, at any depth)."""
    found: list[type[Message]] = []
    stack = list(Message.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (Request, Reply):
            found.append(cls)
    return tuple(found)
