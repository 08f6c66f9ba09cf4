"""Owner tags: which replica holds a session, in the session id itself (no shared table).

A stage replica mints `<id>~<replica>`; every later call for that id goes to `<replica>` only.
An api replica tags the ids it mints (job ids, session ids) with `.<api replica>` before that
(`ServerRuntime.id_tag`), so that a REST call naming the id in its path reaches the api replica
that holds the record: `sess-<uuid>.<api>~<stage replica>`, `<uuid>.<api>`. The
routing key handed to Ray (`handle.options(session_id=...)`) says how to route one call:
`pin:<replica>` (the owner, never another), `place` (a new session: least sessions first) or
empty (a job: any replica, least loaded).
"""

from __future__ import annotations

OWNER_SEP = "~"
PIN = "pin:"
PLACE = "place"


class OwnerGone(Exception):
    """The replica named by a pinned call is not (any longer) a live replica."""

    def __init__(self, replica: str) -> None:
        super().__init__(f"replica {replica} is gone")
        self.replica = replica


def tag(value: str, replica: str) -> str:
    """`value` owned by `replica` (an id already tagged keeps its owner)."""
    return value if owner_of(value) is not None else f"{value}{OWNER_SEP}{replica}"


def owner_of(value: str) -> str | None:
    """The replica named in `value`, or None for an untagged id."""
    head, sep, owner = value.rpartition(OWNER_SEP)
    return owner if sep and head and owner else None


API_SEP = "."


def api_tag(replica: str) -> str:
    return f"{API_SEP}{replica}"


def api_owners_in(path: str) -> list[str]:
    """Candidate api replicas named by the ids in a request path (`/v1/videos/<uuid>.<api>`)."""
    found = []
    for segment in filter(None, path.split("/")):
        head, sep, owner = segment.split(OWNER_SEP, 1)[0].rpartition(API_SEP)
        if sep and head and owner:
            found.append(owner)
    return found


def pin(replica: str) -> str:
    return f"{PIN}{replica}"


def pinned_replica(key: str) -> str | None:
    return key[len(PIN):] if key.startswith(PIN) else None
