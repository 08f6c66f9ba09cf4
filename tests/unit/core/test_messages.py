import msgspec
import pytest

from worldserve.ipc.capabilities import RealtimeCapabilities
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import (
    ChatDelta,
    ChatResult,
    CreateSession,
    Echo,
    ErrorReply,
    Hello,
    RealtimeChunkResult,
    ReasonerRetention,
    ReasonerSampling,
    StageInfo,
    all_message_types,
)


@pytest.fixture(scope="module")
def codec() -> MessageCodec:
    return MessageCodec()


@pytest.mark.parametrize("msg", [
    Hello(request_id="r1", client_id="c"),
    StageInfo(request_id="r2", stage="generation", pid=1, state="ready", model="m",
              model_path="/m", num_params=3,
              capabilities=RealtimeCapabilities(frames_per_chunk=3)),
    Echo(request_id="r3", payload=b"\x00\xff" * 10, delay_ms=5),
    ErrorReply(request_id="r4", code="invalid_request", message="bad"),
    CreateSession(request_id="r5", session_id="s", system_prompt="p",
                  retention=ReasonerRetention(max_video_segments=4),
                  sampling=ReasonerSampling(guided_choice=["a", "b"])),
    RealtimeChunkResult(request_id="r6", session_id="s", chunk_index=0, frames=b"\x01" * 12,
                        num_frames=1, width=2, height=2, forward_ms=1.5),
])
def test_round_trip(codec: MessageCodec, msg: msgspec.Struct) -> None:
    assert codec.decode(codec.encode(msg)) == msg


def test_encoding_is_tagged_msgpack_not_pickle(codec: MessageCodec) -> None:
    data = codec.encode(Hello(request_id="r", client_id="c"))
    raw = msgspec.msgpack.decode(data)
    assert raw["type"] == "Hello"
    assert not data.startswith(b"\x80")  # pickle protocol marker


def test_unknown_or_malformed_input_is_refused(codec: MessageCodec) -> None:
    with pytest.raises(msgspec.DecodeError):
        codec.decode(msgspec.msgpack.encode({"type": "Nope", "request_id": "x"}))
    with pytest.raises(msgspec.ValidationError):
        codec.decode(msgspec.msgpack.encode({"type": "Echo", "request_id": 5}))
    with pytest.raises(msgspec.DecodeError):
        codec.decode(b"\xc1garbage")


def test_terminal_flags() -> None:
    assert ChatDelta.terminal is False
    assert ChatResult.terminal is True


def test_every_message_type_has_a_unique_tag() -> None:
    names = [cls.__name__ for cls in all_message_types()]
    assert len(names) == len(set(names))
