"""The fault soak (`benchmarks/soak.py --faults`, issue 34) at a short duration, on the dev
models as `make serve` serves them: the reasoner and realtime stages SIGKILLed, the output
tmpfs filled, the api SIGKILLed and started again on the same output directory, the generation
stage SIGKILLed (the server exits by design and is started again on the same output
directory), while clients vanish mid-upload, mid-SSE and mid-WebSocket and send bombs.
Asserted: every accepted video job ends completed, cancelled or failed with a reason (none lost
across the restarts, none stuck live), no 5xx but the documented ones (a 503 while a stage
restarts, a 507 while the disk is full; soak_tally.py), no 500 in the server log, /health
answered 200 outside a restart, no orphan process and no temp file after the stop.

Its time is process starts: three server starts and two stage restarts, eleven stage
processes of about 5 CPU-s each, nearly all of it importing torch, diffusers and transformers
(the dev models load and warm up in well under a second); with the api's starts that is about
55 of the run's 75-80 CPU-s, the load the rest. On 2 cores shared with other work the test
gets about one core or less, so its wall time follows the machine's load: 91 s at load 5-6,
124 s at load 7 (135 s before at load 6-7, measured back to back; 163 s at load 5-6 before).
The seed puts the disk-full episode and both stage kills within 0.15 s of each other at 1 s
(the run's first second is clean, and /health is probed once more after every fault is
over: both answer with no fault), then the two
restarts one after the other (soak_faults.plan; a restart waits until every fault in progress
has recovered and takes over from its grace)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import soak
from benchmarks.soak_server import NamespaceUnavailable
from tests.support.machine import missing

KINDS = "kill:reasoner,kill:realtime,disk_full,kill:api,kill:generation"
ARGS = ["--faults", "--kinds", KINDS, "--duration", "12", "--fault-every", "3",
        "--clients", "3", "--disk-mb", "32", "--disk-hold", "3", "--sample-every", "2",
        "--grace", "10", "--job-timeout", "60", "--seed", "3997", "--plot", ""]


def test_faults_lose_no_job_and_leave_nothing_behind(tmp_path: Path,
                                                     dev_models_dir: Path) -> None:
    try:
        result = soak.run_soak(soak.parse_args(ARGS), tmp_path)
    except NamespaceUnavailable as exc:
        missing(f"{exc} (the soak's disk-full episode needs root or user namespaces)")
    assert result["faults_by_kind"] == {kind: 1 for kind in sorted(KINDS.split(","))}
    restarts = {f["kind"]: f for f in result["faults"] if "api_exit_code" in f}
    assert set(restarts) == {"kill:api", "kill:generation"}, result["faults"]
    for restart in restarts.values():  # jobs the restarted server had to find
        assert restart["jobs_accepted_before"] > 0, restart
    # the generation stage's death made the server exit on its own (not the soak's SIGKILL)
    assert restarts["kill:generation"]["api_exit_code"] not in (None, 0, -9), restarts
    assert result["api_starts"] == 3

    states = result["video_jobs_by_state"]
    assert result["nothing_lost"], states
    assert set(states) <= {"completed", "cancelled", "deleted_by_client",
                           "failed:server_restart", "failed:storage_full",
                           "failed:stage_unavailable"}, states
    assert result["num_violations"] == 0, result["violations"]
    assert result["health"].get("200 (no fault)", 0) > 0, result["health"]
    assert result["orphan_processes"] == [] and result["temp_files"] == [], result
    assert result["shutdown_rc"] == 0
    kinds = result["by_kind"]
    assert {"vanish_upload", "vanish_sse", "vanish_ws", "hostile"} <= set(kinds), kinds
