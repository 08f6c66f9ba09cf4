"""The soak's clients (benchmarks/soak.py): one loop per client, each turn one request or
session of a kind picked at random by weight. Every answer goes to the soak's `Tally`."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
from typing import Any, Callable

import httpx
import msgpack
import websockets
from PIL import Image

from tests.integration.hostile.test_bodies import CASES as HOSTILE

WEIGHTS = {"image": 3, "video": 2, "action": 1, "chat": 1, "ws_session": 2,
           "rest_session": 2, "realtime": 1, "hostile": 2, "cancel": 1, "disconnect": 1}
STAGE_OF = {"image": "generation", "video": "generation", "action": "generation",
            "cancel": "generation", "chat": "reasoner", "ws_session": "reasoner",
            "rest_session": "reasoner", "realtime": "realtime"}
SESSION = {"system_prompt": "Describe each frame in one short sentence.",
           "sampling": {"max_tokens": 8}}
FRAMES_PER_SESSION = 3
THINK_S = 0.2
DOWN_THINK_S = 1.0


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (seed * 37 % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


def png_data_url() -> str:
    out = io.BytesIO()
    Image.new("RGB", (56, 40), (30, 160, 90)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


class Load:
    weights = WEIGHTS  # kind -> weight; a kind is the method of that name
    cases = HOSTILE  # the hostile bodies: (name, send, expected status)

    def __init__(self, base: str, tally: Any, rng: random.Random) -> None:
        self.base = base
        self.ws_base = base.replace("http://", "ws://")
        self.tally = tally
        self.rng = rng
        self.http: httpx.AsyncClient | None = None
        self.chat_model = "worldserve-dev-cosmos3"

    async def start(self) -> None:
        self.http = httpx.AsyncClient(base_url=self.base, timeout=120)
        models = (await self.http.get("/v1/models")).json()["data"]
        self.chat_model = next(m["id"] for m in models if m["stage"] == "reasoner")

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def client(self, index: int, keep_going: Callable[[], bool]) -> None:
        rng = random.Random(self.rng.random() + index)
        kinds, weights = list(self.weights), list(self.weights.values())
        while keep_going():
            kind = rng.choices(kinds, weights)[0]
            try:
                await getattr(self, kind)(rng)
            except (httpx.HTTPError, OSError, websockets.WebSocketException,
                    asyncio.TimeoutError) as exc:
                self.tally.record(kind, type(exc).__name__, None, STAGE_OF.get(kind))
            # while the api restarts, one try a second per client (as a client honouring
            # Retry-After would), not a busy loop competing with the stages' start for the CPU
            await asyncio.sleep(DOWN_THINK_S if self.tally.api_down else THINK_S * rng.random())

    def _record(self, kind: str, response: httpx.Response) -> None:
        self.tally.record(kind, response.status_code, response, STAGE_OF.get(kind))

    # ------------------------------------------------------------------ HTTP kinds

    async def image(self, rng: random.Random) -> None:
        fmt = rng.choice(["b64_json", "url"])
        answer = await self.http.post("/v1/images/generations", json={
            "prompt": "a red cube", "seed": rng.randrange(1000), "response_format": fmt})
        self._record("image", answer)
        if answer.status_code == 200 and fmt == "url":
            self._record("image_content", await self.http.get(answer.json()["data"][0]["url"]))

    async def video(self, rng: random.Random, steps: int | None = None) -> str | None:
        body = {"prompt": "a robot", "size": "48x32", "num_frames": 9, "generate_sound": True,
                "seed": rng.randrange(1000)}
        if steps:
            body["num_inference_steps"] = steps
        answer = await self.http.post("/v1/videos", json=body)
        self._record("cancel" if steps else "video", answer)
        if answer.status_code != 200:
            return None
        self.tally.accepted(answer.json()["id"])
        return answer.json()["id"]

    async def action(self, rng: random.Random) -> None:
        self._record("action", await self.http.post("/v1/actions/generations", json={
            "input": {"task": "pick", "image": png_data_url()},
            "parameters": {"domain_name": "pusht", "action_horizon": 4,
                           "resolution_tier": 256}}))

    async def chat(self, rng: random.Random) -> None:
        self._record("chat", await self.http.post("/v1/chat/completions", json={
            "model": self.chat_model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hello"}]}))

    async def rest_session(self, rng: random.Random) -> None:
        created = await self.http.post("/v1/streaming/sessions", json=SESSION)
        self._record("rest_session", created)
        if created.status_code != 201:
            return
        sid = created.json()["session_id"]
        for _ in range(FRAMES_PER_SESSION):
            self._record("rest_frame", await self.http.post(
                f"/v1/streaming/sessions/{sid}/frame", content=jpeg(rng.randrange(99)),
                headers={"content-type": "image/jpeg"}))
        await self.http.delete(f"/v1/streaming/sessions/{sid}")

    async def cancel(self, rng: random.Random) -> None:
        job_id = await self.video(rng, steps=200)
        if job_id is not None:
            await asyncio.sleep(rng.uniform(0.1, 2.0))
            self.tally.deleting(job_id)
            self._record("cancel_delete", await self.http.delete(f"/v1/videos/{job_id}"))

    async def hostile(self, rng: random.Random) -> None:
        name, send, expected = rng.choice(self.cases)

        def run() -> httpx.Response:
            with httpx.Client(base_url=self.base, timeout=120) as http:
                return send(http, self.chat_model)

        try:
            response = await asyncio.to_thread(run)
        except AssertionError:  # a frame case could not open its session (slots busy)
            self.tally.record("hostile", "no_session_slot")
            return
        path = response.request.url.path
        stage = "reasoner" if path.startswith(("/v1/streaming", "/v1/chat")) else "generation"
        self.tally.client_input("hostile", response, stage)
        if response.status_code < 500 and expected and response.status_code != expected:
            self.tally.record("hostile_other_4xx", f"{name}: {response.status_code}")

    # ------------------------------------------------------------------ WebSocket kinds

    async def ws_session(self, rng: random.Random) -> None:
        async with websockets.connect(f"{self.ws_base}/v1/streaming/ws", max_size=None,
                                      open_timeout=30) as ws:
            await ws.send(json.dumps({"op": "create", **SESSION}))
            created = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if created["op"] != "created":
                self.tally.ws_error("ws_session", created.get("code", 0),
                                    created.get("message", ""), "reasoner")
                return
            self.tally.record("ws_session", "created")
            for _ in range(FRAMES_PER_SESSION):
                await ws.send(jpeg(rng.randrange(99)))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if reply["op"] != "frame":
                    self.tally.ws_error("ws_frame", reply.get("code", 0),
                                        reply.get("message", ""), "reasoner")
                    return
                self.tally.record("ws_frame", "ok")
            await ws.send(json.dumps({"op": "delete"}))
            await asyncio.wait_for(ws.recv(), 60)

    async def realtime(self, rng: random.Random, cut_after: int | None = None) -> None:
        init = {"type": "init", "prompt": "a castle", "max_chunks": 2,
                "seed": rng.randrange(1000)}
        async with websockets.connect(f"{self.ws_base}/v1/realtime_video/generate",
                                      max_size=None, open_timeout=30) as ws:
            await ws.send(msgpack.packb(init))
            received = 0
            try:
                while cut_after is None or received < cut_after:
                    message = await asyncio.wait_for(ws.recv(), 300)
                    received += 1
                    self._realtime_error(message)
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else "no_close_frame"
                self.tally.record("realtime", code, None, "realtime")

    def _realtime_error(self, message: Any) -> None:
        try:
            decoded = msgpack.unpackb(message)
        except (ValueError, msgpack.UnpackException, TypeError):
            return  # a raw frame payload
        if isinstance(decoded, dict) and decoded.get("type") == "error":
            self.tally.record("realtime_error", decoded.get("code", "error"), None, "realtime")

    async def disconnect(self, rng: random.Random) -> None:
        """A client that goes away mid-request: the server must not care."""
        how = rng.choice(["http", "ws_frame", "realtime"])
        if how == "http":
            try:
                await self.http.post("/v1/images/generations", json={"prompt": "gone"},
                                     timeout=0.05)
            except httpx.TimeoutException:
                pass
        elif how == "ws_frame":
            async with websockets.connect(f"{self.ws_base}/v1/streaming/ws") as ws:
                await ws.send(json.dumps({"op": "create", **SESSION}))
                if json.loads(await asyncio.wait_for(ws.recv(), 60))["op"] == "created":
                    await ws.send(jpeg(1))  # and close before the answer
        else:
            await self.realtime(rng, cut_after=1)
        self.tally.record("disconnect", how)
