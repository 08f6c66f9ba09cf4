"""The merged `GET /v1/videos` of several api replicas (cluster/listing.py), without Ray: each
replica is a real SQLite record store, and every page walk in both orders must equal the
reference order (created_at, replica, seq) that a plain sort of all records gives, with the
single-node cursor rules (`has_more`, an unknown `after` gives an empty page)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.store import RecordStore
from worldserve.cluster.ids import api_tag
from worldserve.cluster.listing import Position, Row, api_replica_of, merged_page

REPLICAS = ["apiB", "apiA", "apiC"]


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, RecordStore]:
    """~20 records per replica over 6 seconds, so that many share a created_at second."""
    rng = random.Random(7)
    out = {}
    for replica in REPLICAS:
        store = RecordStore(tmp_path / replica / "records.sqlite3")
        for created_at in sorted(rng.randrange(100, 106) for _ in range(20)):
            store.insert(JobRecord(id=f"{uuid.uuid4()}{api_tag(replica)}", kind="video",
                                   created_at=created_at, size="48x32"))
        store.insert(JobRecord(id=f"{uuid.uuid4()}{api_tag(replica)}", kind="image",
                               created_at=103, size="32x32"))  # never listed
        out[replica] = store
    return out


def reference(stores: dict[str, RecordStore], descending: bool) -> list[str]:
    rows = [(r.created_at, replica, r.seq, r.id) for replica, store in stores.items()
            for r in store.page_after("video", None, 1000, False, 0)[0]]
    return [row[3] for row in sorted(rows, reverse=descending)]


async def page(stores: dict[str, RecordStore], after: str | None, limit: int,
               descending: bool) -> dict:
    async def position_of(replica: str, job_id: str) -> Position | None:
        return stores[replica].position(job_id, "video")

    async def rows_of(replica: str, anchor: Position | None, n: int,
                      descending: bool) -> list[Row]:
        records, _ = stores[replica].page_after("video", anchor, n, descending, 0)
        return [(r.created_at, replica, r.seq, {"id": r.id}) for r in records]

    return await merged_page(list(stores), position_of, rows_of, after, limit, descending)


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("limit", [1, 7, 60, 100])
async def test_walking_the_pages_gives_the_reference_order(
        stores: dict[str, RecordStore], limit: int, descending: bool) -> None:
    seen, after, pages = [], None, 0
    while True:
        listing = await page(stores, after, limit, descending)
        ids = [job["id"] for job in listing["data"]]
        assert len(ids) <= limit
        assert (listing["first_id"], listing["last_id"]) == (
            (ids[0], ids[-1]) if ids else (None, None))
        seen += ids
        pages += 1
        if not listing["has_more"]:
            break
        after = listing["last_id"]
    assert seen == reference(stores, descending)
    assert pages == max(1, -(-len(seen) // limit))  # has_more is false exactly on the last page


async def test_an_after_that_names_no_record_gives_an_empty_page(
        stores: dict[str, RecordStore]) -> None:
    empty = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    for after in (f"{uuid.uuid4()}{api_tag('apiA')}",  # no such job on its replica
                  f"{uuid.uuid4()}{api_tag('gone')}",  # a replica that is not live
                  str(uuid.uuid4())):                  # no replica named at all
        assert await page(stores, after, 10, True) == empty
    image = stores["apiA"].page_after("image", None, 1, False, 0)[0][0].id
    assert await page(stores, image, 10, True) == empty  # not a video


def test_the_api_replica_is_read_from_the_job_id() -> None:
    assert api_replica_of(f"{uuid.uuid4()}.k3j5") == "k3j5"
    assert api_replica_of(str(uuid.uuid4())) is None
