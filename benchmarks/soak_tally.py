"""The soak's `Tally` (benchmarks/soak.py): every answer by kind and status, every 5xx and
every client-side error by cause, /health through the run, and what must never happen.

A fault in progress is known here (`restarting` stages, `api_down`, `disk_full`, set by
benchmarks/soak_faults.py): a 503 `stage_unavailable` while the route's stage (or the api)
restarts and a 507 `storage_full` while the disk is full are documented answers; a 503
`capacity_exceeded` is load shedding (documented, with `Retry-After`), counted apart; any other
5xx is a violation, and so is a 503 without `Retry-After`."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

import httpx

# client-side failures that mean "the server did not answer": allowed only while the api is down
NO_ANSWER = ("ConnectError", "RemoteProtocolError", "ReadError", "ConnectionClosedError",
             "InvalidMessage", "ConnectionRefusedError", "ConnectionResetError")


def ws_cause(status: int, message: str) -> str:
    """A WebSocket error op's cause: its code is the HTTP status and its message says which
    (streaming-reasoning §8.4; `session slots exhausted` is the stage's capacity)."""
    return f"{status} {'capacity_exceeded' if 'exhausted' in message else 'stage_unavailable'}"


def error_cause(status: int, response: httpx.Response | None) -> str:
    """`<status> <code>`: the taxonomy's code when the body names it, else its `type`."""
    try:
        error = response.json()["error"] if response is not None else {}
    except (ValueError, KeyError, TypeError):
        error = {}
    code = error.get("code") if isinstance(error, dict) else None
    name = code if isinstance(code, str) else (error.get("type") if isinstance(error, dict)
                                                else None)
    return f"{status} {name or 'no_error_body'}"


# a stage (or the whole server) starting again: stage_unavailable (native routes name only the
# type, service_unavailable), the api's "server is starting" (service_unavailable_error)
RESTART_503 = ("503 stage_unavailable", "503 service_unavailable",
               "503 service_unavailable_error")


def documented(cause: str, window: str, disk_full: bool = False) -> bool:
    """Load shedding (503 capacity_exceeded; type server_overloaded where a surface's `code` is
    the status) at any time; a 503 (or a WebSocket closed 1011)
    for a stage while it restarts; 507 storage_full while the disk is full, also when a
    restart overlaps it (`window` names only the first fault in progress; `disk_full`)."""
    if cause in ("503 capacity_exceeded", "503 server_overloaded"):  # code, or only its type
        return True
    if cause in RESTART_503 or cause == "ws close 1011":
        return window.endswith("restarting")
    return cause.startswith("507 ") and (window == "disk full" or disk_full)


class Tally:
    """Answers by kind and status, and what must never happen."""

    def __init__(self) -> None:
        self.by_kind: dict[str, Counter] = defaultdict(Counter)
        self.violations: list[str] = []
        self.jobs: list[str] = []
        self.watch: Any = None  # soak_faults.JobWatch, told of every accepted job
        self.restarting: set[str] = set()
        self.api_down = False
        self.disk_full = False
        self.fivexx: Counter = Counter()  # "<status> <code> (<window>)" -> n
        self.client_errors: Counter = Counter()  # "<exception> (<window>)" -> n
        self.health: Counter = Counter()  # "<status> (<window>)" -> n
        self.log_errors: Counter = Counter()  # the server log's ERROR lines, numbers as N

    # ------------------------------------------------------------------ jobs

    def accepted(self, job_id: str) -> None:
        self.jobs.append(job_id)
        if self.watch is not None:
            self.watch.accepted(job_id)

    def deleting(self, job_id: str) -> None:
        if self.watch is not None:
            self.watch.deleting(job_id)

    # ------------------------------------------------------------------ answers

    def window(self, stage: str | None) -> str:
        """The fault in progress that can excuse an answer to a request on `stage`'s route."""
        if self.api_down:
            return "api restarting"
        if stage is not None and stage in self.restarting:
            return f"{stage} restarting"
        if stage is None and self.restarting:
            return "a stage restarting"
        return "disk full" if self.disk_full else "no fault"

    def record(self, kind: str, status: int | str, response: httpx.Response | None = None,
               stage: str | None = None) -> None:
        self.by_kind[kind][str(status)] += 1
        if isinstance(status, str):
            self._client_error(kind, status, stage)
        elif status == 1011:  # a WebSocket closed for a server error
            self._count(kind, "ws close 1011", self.window(stage), "")
        elif 500 <= status < 1000:
            self._server_error(kind, status, response, stage)

    def ws_error(self, kind: str, status: int, message: str, stage: str | None) -> None:
        """A WebSocket `error` op (its `code` an HTTP status)."""
        self.by_kind[kind][str(status)] += 1
        if status >= 500:
            self._count(kind, ws_cause(status, message), self.window(stage), message)

    def client_input(self, kind: str, response: httpx.Response, stage: str | None) -> None:
        """Hostile input: a 4xx, or one of the documented 5xx while a fault lasts."""
        self.record(kind, response.status_code, response, stage)

    def _client_error(self, kind: str, name: str, stage: str | None) -> None:
        if name not in NO_ANSWER:
            return  # a timeout, a session slot refused...: counted by kind only
        window = self.window(stage)
        self.client_errors[f"{name} ({window})"] += 1
        if not window.endswith("restarting"):
            self.violations.append(f"{kind}: no answer ({name}) during '{window}'")

    def _server_error(self, kind: str, status: int, response: httpx.Response | None,
                      stage: str | None) -> None:
        path = response.request.url.path if response is not None else ""
        if status == 503 and response is not None and "retry-after" not in response.headers:
            self.violations.append(f"{kind} {path}: 503 without Retry-After")
        body = response.text[:200] if response is not None else ""
        self._count(f"{kind} {path}", error_cause(status, response), self.window(stage), body)

    def _count(self, where: str, cause: str, window: str, detail: str) -> None:
        self.fivexx[f"{cause} ({window})"] += 1
        if not documented(cause, window, self.disk_full):
            self.violations.append(f"{where}: {cause} during '{window}': {detail[:200]}")

    def server_log(self, text: str) -> None:
        """Errors only the server saw (a client that went away never gets its 500)."""
        for line in text.splitlines():
            if " ERROR " in line or line.startswith("ERROR:"):
                self.log_errors[re.sub(r"[0-9a-f-]{32,}|\d+", "N", line.split("ERROR", 1)[1])
                                [:120].strip()] += 1
            if "unhandled error on" in line or "Exception in ASGI application" in line:
                self.fivexx["500 in the server log"] += 1
                self.violations.append(f"server log: {line[:200]}")

    def health_answer(self, status: int | str) -> None:
        """One /health probe: 200, or a documented fault (a stage or the api restarting)."""
        window = "api restarting" if self.api_down else (
            "a stage restarting" if self.restarting else
            "disk full" if self.disk_full else "no fault")
        self.health[f"{status} ({window})"] += 1
        if status != 200 and window in ("no fault", "disk full"):
            self.violations.append(f"/health answered {status} during '{window}'")

    def summary(self) -> dict[str, Any]:
        statuses: Counter = Counter()
        for counter in self.by_kind.values():
            statuses.update(counter)
        return {
            "requests": sum(statuses.values()),
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "5xx_by_cause": dict(sorted(self.fivexx.items())),
            "no_answer_by_cause": dict(sorted(self.client_errors.items())),
            "health": dict(sorted(self.health.items())),
            "server_log_errors": dict(self.log_errors.most_common(20)),
            "violations": self.violations[:20], "num_violations": len(self.violations),
        }
