"""Owner tags, routing keys and the `OwnerRouter` ranking, without a Ray cluster (the router
and the client are driven directly; replicas are stand-ins with an id and routing stats)."""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from ray.serve._private.common import StreamingHTTPRequest

from worldserve.cluster.app import parse_replicas
from worldserve.cluster.client import RayStageClient
from worldserve.cluster.ids import PLACE, OwnerGone, api_owners_in, owner_of, pin, tag
from worldserve.cluster.router import ApiRouter, OwnerRouter, request_path
from worldserve.errors import SessionLost
from worldserve.ipc.messages import (
    Cancel,
    CloseSession,
    CreateSession,
    RealtimeChunk,
    RealtimeOpen,
    RealtimeReleased,
    ReasonerRetention,
    ReasonerSampling,
    SessionFrame,
    StatsRequest,
)


@dataclass
class Replica:
    unique_id: str
    routing_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def replica_id(self) -> SimpleNamespace:
        return SimpleNamespace(unique_id=self.unique_id)


def pending(key: str) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(session_id=key),
                           future=asyncio.get_running_loop().create_future())


def router() -> OwnerRouter:
    r = OwnerRouter.__new__(OwnerRouter)  # the ranking needs no Serve state
    r.initialize_state()
    return r


def test_tags_name_their_owner() -> None:
    assert owner_of(tag("sess-1234", "abcd")) == "abcd"
    assert tag(tag("sess-1", "a"), "b") == "sess-1~a"  # a tagged id keeps its owner
    assert owner_of("sess-1234") is None and owner_of("~x") is None and owner_of("a~") is None


def test_api_owners_are_found_in_paths() -> None:
    assert api_owners_in("/v1/videos/1234-abcd.apiA/content") == ["apiA"]
    assert api_owners_in("/v1/streaming/sessions/sess-12.apiB~stage/frame") == ["apiB"]
    assert api_owners_in("/v1/streaming/ws") == [] and api_owners_in("") == []


def test_the_api_router_reads_the_path_of_a_proxy_request() -> None:
    scope = {"type": "http", "path": "/v1/videos/1234.apiA"}
    arg = pickle.dumps(StreamingHTTPRequest(scope, proxy_actor_name="proxy"))
    assert request_path(SimpleNamespace(args=[arg])) == "/v1/videos/1234.apiA"
    assert request_path(SimpleNamespace(args=[b"not a pickle"])) == ""
    assert request_path(SimpleNamespace(args=[])) == ""


async def test_the_api_router_pins_named_ids_and_spreads_the_rest() -> None:
    api = ApiRouter.__new__(ApiRouter)
    a, b = Replica("apiA"), Replica("apiB")

    def proxied(path: str, session_header: str | None = None) -> SimpleNamespace:
        scope = {"type": "http", "path": path}
        request = pending(session_header or "")  # the proxy's session id: a client header
        request.args = [pickle.dumps(StreamingHTTPRequest(scope, proxy_actor_name="proxy"))]
        return request

    assert await api.choose_replicas([a, b], proxied("/v1/videos/1.apiB")) == [[b]]
    gone = await api.choose_replicas([a, b], proxied("/v1/videos/1.apiC"))
    assert len(gone) == 1 and len(gone[0]) == 2  # its record is gone: any replica answers 404
    # a client cannot pin (nor fail its own request naming a gone replica) through the header
    forged = proxied("/v1/videos", session_header=pin("apiC"))
    assert len((await api.choose_replicas([a, b], forged))[0]) == 2
    assert not forged.future.done()


async def test_calls_between_api_replicas_are_pinned() -> None:
    """The merged job listing (cluster/listing.py) asks each api replica in turn."""
    api = ApiRouter.__new__(ApiRouter)
    a, b = Replica("apiA"), Replica("apiB")
    call = pending(pin("apiA"))
    call.args = [None, 11, True, "http://x"]  # job_rows(anchor, n, descending, base_url)
    assert await api.choose_replicas([a, b], call) == [[a]]
    gone = pending(pin("apiC"))
    gone.args = ["job-id"]
    await api.choose_replicas([a, b], gone)
    with pytest.raises(OwnerGone):
        gone.future.result()


def test_parse_replicas() -> None:
    assert parse_replicas("generation=2, reasoner=1") == {"generation": 2, "reasoner": 1}
    assert parse_replicas(None) == {}
    with pytest.raises(ValueError, match="STAGE one of generation, reasoner, realtime"):
        parse_replicas("vae=2")
    with pytest.raises(ValueError, match="whole number >= 1 .got '0'"):
        parse_replicas("reasoner=0")


async def test_pinned_calls_go_to_the_owner_only() -> None:
    a, b = Replica("a"), Replica("b")
    request = pending(pin("b"))
    assert await router().choose_replicas([a, b], request) == [[b]]
    assert not request.future.done()


async def test_a_gone_owner_fails_the_call_at_once_without_spilling() -> None:
    request = pending(pin("gone"))
    await router().choose_replicas([Replica("a")], request)
    with pytest.raises(OwnerGone, match="replica gone is gone"):
        request.future.result()


async def test_new_sessions_go_to_the_least_loaded_then_spread() -> None:
    r = router()
    a, b = Replica("a", {"sessions": 3}), Replica("b", {"sessions": 1})
    ranked = await r.choose_replicas([a, b], pending(PLACE))
    assert ranked == [[b], [a]]
    for _ in range(2):  # two placements on b, not yet in its stats: a now ranks first
        r.on_request_routed(pending(PLACE), b.replica_id, None)
    assert (await r.choose_replicas([a, b], pending(PLACE)))[0] == [a]


async def test_jobs_may_go_anywhere() -> None:
    replicas = [Replica(str(i)) for i in range(4)]
    ranked = await router().choose_replicas(replicas, pending(""))
    assert len(ranked) == 1 and len(ranked[0]) == 2 and set(map(id, ranked[0])) <= set(
        map(id, replicas))


def frame(session_id: str) -> SessionFrame:
    return SessionFrame(request_id="r", session_id=session_id, image=b"", received_at=0.0)


def test_client_routing_keys() -> None:
    client = RayStageClient("reasoner", handle=None)  # type: ignore[arg-type]
    owned = tag("sess-1", "own")
    create = CreateSession(request_id="r", session_id="sess-1", system_prompt="",
                           retention=ReasonerRetention(), sampling=ReasonerSampling())
    assert client._key(create) == PLACE
    assert client._key(frame(owned)) == pin("own")
    assert client._key(CloseSession(request_id="r", session_id=owned)) == pin("own")
    with pytest.raises(SessionLost, match="session lost, create a new one"):
        client._key(frame("sess-untagged"))
    assert client._key(StatsRequest(request_id="r")) == ""
    assert client._key(Cancel(request_id="c", target_id="unknown")) == ""


def test_client_remembers_realtime_owners_from_the_open() -> None:
    client = RayStageClient("realtime", handle=None)  # type: ignore[arg-type]
    opening = RealtimeOpen(request_id="o", session_id="rt-1")
    chunk0 = RealtimeChunk(request_id="r0", session_id="rt-1", chunk_index=0)
    assert client._key(opening) == PLACE
    with pytest.raises(SessionLost):  # a chunk of a session never opened has no owner
        client._key(chunk0)
    client._remember(opening, "own", None)  # type: ignore[arg-type]
    chunk1 = RealtimeChunk(request_id="r1", session_id="rt-1", chunk_index=1)
    assert client._key(chunk0) == client._key(chunk1) == pin("own")
    assert client._key(opening) == pin("own")  # a reset stays on the owner
    client._remember(chunk1, "own", RealtimeReleased(request_id="x", session_id="rt-1",
                                                     existed=True))
    with pytest.raises(SessionLost):
        client._key(chunk1)


def test_the_ray_client_is_a_stage_client() -> None:
    from worldserve.ipc.client import StageClient

    client = RayStageClient("generation", handle=None)  # type: ignore[arg-type]
    assert isinstance(client, StageClient)
    assert client.address == "ray://generation" and client.state == "starting"
    assert client.client_id and client.info is None and client.down_reason is None


@pytest.mark.parametrize("parallel, per_replica, expected", [
    ("cfg=2,ulysses=2", 1.0, 4.0), ("ulysses=3", 1.0, 3.0), (None, 1.0, 1.0),
    ("cfg=2", 0.0, 0.0),  # a CPU cluster: the ranks use gloo
    ("cfg=2", 4.0, 4.0)])
def test_a_generation_replica_asks_for_one_gpu_per_rank(parallel, per_replica, expected):
    from worldserve.cluster.app import replica_num_gpus
    from worldserve.config import ServerConfig

    stages = {"generation": {"parallel": parallel}} if parallel else {}
    config = ServerConfig.model_validate({"stages": stages})
    assert replica_num_gpus("generation", config, per_replica) == expected
    assert replica_num_gpus("reasoner", config, per_replica) == per_replica
