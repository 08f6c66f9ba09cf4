"""ZeroMQ transport between the api process (DEALER, asyncio) and a stage (ROUTER, blocking).

Addresses are `ipc://<run-dir>/<stage>.sock` or `tcp://127.0.0.1:<port>`; nothing else binds.
"""

from __future__ import annotations

import zmq

from worldserve.config import is_loopback_host
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import Message

# High-water marks bound the messages queued in ZeroMQ per peer (overflow blocks the sender).
SOCKET_HWM = 10_000


def check_address(address: str) -> str:
    """Refuse any address that is not ipc:// or loopback tcp://."""
    if address.startswith("ipc://"):
        return address
    if address.startswith("tcp://"):
        host = address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        if is_loopback_host(host):
            return address
    raise ValueError(f"stage address {address!r} must be ipc:// or tcp:// on a loopback host")


class StageServer:
    """Stage side: a ROUTER socket; peers are api clients identified by ZeroMQ identity."""

    def __init__(self, address: str) -> None:
        self.address = check_address(address)
        self._codec = MessageCodec()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        self._sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        self._sock.bind(self.address)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Message | None]]:
        """Every message waiting (after at most `timeout_ms`); undecodable ones come back None."""
        out: list[tuple[bytes, Message | None]] = []
        if not self._poller.poll(timeout_ms):
            return out
        while True:
            try:
                peer, data = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append((peer, self._codec.decode(data)))
            except Exception:  # a malformed frame must not kill the stage; the caller logs it
                out.append((peer, None))

    def send(self, peer: bytes, msg: Message) -> None:
        self._sock.send_multipart([peer, self._codec.encode(msg)])

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
