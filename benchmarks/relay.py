"""Relay cost: api -> stage -> api round trips over real ZeroMQ, beside an in-process call.

Starts one real generation stage process (dev checkpoint) through the Supervisor and sends
`Echo` messages (handled by the stage loop, no model work). The in-process baseline runs the
same message through the codec and an awaited call in one process.

    .venv/bin/python benchmarks/relay.py [--n-1k 2000] [--n-1m 200]

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from worldserve.config import build_config  # noqa: E402
from worldserve.ipc.client import StageClient  # noqa: E402
from worldserve.ipc.codec import MessageCodec  # noqa: E402
from worldserve.ipc.messages import Echo, EchoReply  # noqa: E402
from worldserve.runtime.supervisor import Supervisor  # noqa: E402

CONCURRENCY = 16


async def sequential_ms(client: StageClient, payload: bytes, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        await client.call(Echo(request_id=f"s{i}", payload=payload), timeout_s=30)
        out.append((time.perf_counter() - started) * 1000)
    return out


async def throughput(client: StageClient, payload: bytes, n: int) -> float:
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            await client.call(Echo(request_id=f"t{i}", payload=payload), timeout_s=30)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return n / (time.perf_counter() - started)


async def inprocess_ms(payload: bytes, n: int) -> list[float]:
    """Baseline: the same typed message encoded, decoded and answered by an awaited call."""
    codec = MessageCodec()

    async def handle(data: bytes) -> bytes:
        msg = codec.decode(data)
        return codec.encode(EchoReply(request_id=msg.request_id, payload=msg.payload))

    out = []
    for i in range(n):
        started = time.perf_counter()
        codec.decode(await handle(codec.encode(Echo(request_id=f"i{i}", payload=payload))))
        out.append((time.perf_counter() - started) * 1000)
    return out


async def main(n_1k: int, n_1m: int) -> dict[str, float]:
    config = build_config({"stages": {
        "reasoner": {"enabled": False}, "realtime": {"enabled": False},
        "generation": {"model_path": str(harness.dev_model("generation"))}}})
    supervisor = Supervisor(config)
    await supervisor.start()
    client = supervisor.clients["generation"]
    result: dict[str, float] = {}
    try:
        for label, size, n in (("1k", 1024, n_1k), ("1m", 1024 * 1024, n_1m)):
            payload = b"\x5a" * size
            await sequential_ms(client, payload, max(10, n // 20))  # warm the path
            relay = await sequential_ms(client, payload, n)
            base = await inprocess_ms(payload, n)
            result[f"relay_p50_ms_{label}"] = round(statistics.median(relay), 4)
            result[f"relay_p99_ms_{label}"] = round(harness.percentile(relay, 0.99), 4)
            result[f"relay_msgs_per_s_{label}"] = round(await throughput(client, payload, n), 1)
            result[f"inproc_p50_ms_{label}"] = round(statistics.median(base), 4)
            result[f"relay_over_inproc_p50_{label}"] = round(
                statistics.median(relay) / max(statistics.median(base), 1e-9), 1
            )
    finally:
        await supervisor.stop()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-1k", type=int, default=2000)
    parser.add_argument("--n-1m", type=int, default=200)
    args = parser.parse_args()
    harness.emit(asyncio.run(main(args.n_1k, args.n_1m)))
