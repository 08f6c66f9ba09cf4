"""msgpack encoding of `Message` structs (typed, tagged; never pickle)."""

from __future__ import annotations

from typing import Union

import msgspec

from worldserve.ipc.messages import Message, all_message_types


class MessageCodec:
    """Encodes any Message; decodes only the registered message types."""

    def __init__(self) -> None:
        types = all_message_types()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Union[types])  # type: ignore[valid-type]

    def encode(self, msg: Message) -> bytes:
        return self._encoder.encode(msg)

    def decode(self, data: bytes) -> Message:
        return self._decoder.decode(data)
