"""The first-GPU check: one script for a bare, offline GPU host, under 8 minutes on one H100.

    python benchmarks/gpu_check.py [--parts plan,fp8,...] [--budget-s 450] [--out result.json]
    python benchmarks/gpu_check.py --device cpu        # tiny sizes (the unit test)

It needs no checkpoint and no network: it first builds the dev models it reads (what
`worldserve dev-models build` builds, into `--dev-models` or the dev-model cache; a built cache
is reused), and every large model is random-weight, built on the device. Parts, fastest first
(each `part(setup, tmp, out)`, benchmarks/gpu_check_parts.py and gpu_check_models.py):

  plan       the GPUs; the placement plan of Nano- and Super-sized counts and of the dev models;
  fp8        a tiny FP8 Cosmos3 reasoner decoding through the reasoner engine, W8A8 where the
             device allows (static step and transformers' forward): tokens, ms/token;
             on CUDA also benchmarks/fp8.py's W8A8 vs W8A16 comparison;
  generator  a random Nano-shaped generator (15.2 B, bf16) through `Cosmos3Runner`: s/step at
             480p then 720p, 189 frames, CFG 6, `native` and `flash`/`_native_cudnn` attention;
  reasoner   a random Omni of Nano's text shape through the reasoner engine: ms/token, b1, b4;
  load       host memory while the Cosmos3 loader reads a random ~1.5 B generator onto the
             GPU: straight there vs a host copy and `.to(device)`, in child processes;
  parallel   benchmarks/parallel.py `part_parallel`: rank groups on the GPUs there are.

Each part has its own time budget (`PART_BUDGET_S`, cut to what is left of `--budget-s`) and
its own try/except: a part that fails or runs out of time reports its error beside the figures
it had, and the next part runs; no part starts once `--budget-s` is spent (counted from the
start, the dev-model build included). Parts run in this one process (CUDA memory freed between
them); a CUDA error that poisons the context would fail the parts after it too. Prints one JSON
line on stdout (harness.emit: with the machine's facts) and a table on stderr; exit status 1
when any part failed. `--device cpu`: tiny shapes in float32; the figures then mean nothing.
Never run on CUDA from this repository's sessions so far: docs/hardware.md says what is verified.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_check_models, gpu_check_parts, harness  # noqa: E402
from benchmarks.gpu_check_parts import Figures, free, peak_gib, reset_peak  # noqa: E402

Part = Callable[[argparse.Namespace, Path, Figures], None]


def part_parallel(setup: argparse.Namespace, tmp: Path, out: Figures) -> None:
    """benchmarks/parallel.py's part (imported when it runs: it spawns rank processes)."""
    from benchmarks.parallel import part_parallel as parallel

    out.update(parallel(setup, tmp))


# In the order they run (fastest first) with their budgets in seconds, sized for one H100
# (estimates: no GPU has run this); the sum is above the default --budget-s on purpose, as
# most parts finish well within theirs.
PARTS: dict[str, Part] = {
    "plan": gpu_check_parts.part_plan, "fp8": gpu_check_parts.part_fp8,
    "generator": gpu_check_models.part_generator, "reasoner": gpu_check_models.part_reasoner,
    "load": gpu_check_parts.part_load, "parallel": part_parallel}
PART_BUDGET_S = {"plan": 45.0, "fp8": 60.0, "generator": 150.0, "reasoner": 90.0,
                 "load": 90.0, "parallel": 120.0}
BUDGET_S = 450.0  # + imports and the last part's clean-up: within 8 minutes


class PartTimeout(BaseException):
    """A part ran past its budget (a BaseException: a part's own `except Exception` around
    one measurement must not swallow it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise PartTimeout in this (the main) thread after `seconds` (SIGALRM: between Python
    bytecodes, so a call blocked inside a kernel is stopped when it returns)."""

    def expire(signum: int, frame: Any) -> None:
        raise PartTimeout(f"past its {seconds:.0f} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _children() -> set[int]:
    """This process's child processes (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid():
            found.add(int(stat.parent.name))
    return found


def run_part(part: Part, setup: argparse.Namespace, tmp: Path, budget_s: float) -> Figures:
    """One part under its budget: its figures, plus `error` when it failed or timed out."""
    out: Figures = {}
    started, before = time.perf_counter(), _children()
    reset_peak(setup.device)
    try:
        with deadline(budget_s):
            part(setup, tmp, out)
    except PartTimeout as exc:
        out["error"] = f"timed out: {exc}; figures so far kept"
        for pid in _children() - before:  # processes the part started and left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    except Exception as exc:  # one broken part must not hide the others' figures
        out["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        traceback.print_exc()
    out["part_s"] = round(time.perf_counter() - started, 1)
    out["budget_s"] = round(budget_s, 1)
    out["part_peak_gib"] = peak_gib(setup.device)  # this process (not its children)
    free()
    return out


def run_parts(setup: argparse.Namespace, names: list[str], parts: dict[str, Part] = PARTS,
              budgets: dict[str, float] = PART_BUDGET_S, started: float | None = None
              ) -> dict[str, Figures]:
    """Every part in `parts`, in order: run when named and while time is left, else why not."""
    started = time.perf_counter() if started is None else started
    result: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name, part in parts.items():
            left = setup.budget_s - (time.perf_counter() - started)
            if name not in names:
                result[name] = {"skipped": "not asked (--parts)"}
            elif left <= 0:
                result[name] = {"skipped": f"--budget-s {setup.budget_s:.0f} spent"}
            else:
                print(f"gpu_check: {name} ({min(budgets[name], left):.0f} s)", file=sys.stderr)
                result[name] = run_part(part, setup, Path(tmp), min(budgets[name], left))
    return result


def build_dev_models(setup: argparse.Namespace) -> Figures:
    """The dev models, built by `worldserve dev-models build` unless already there."""
    if setup.dev_models is not None:
        os.environ["WORLDSERVE_DEV_MODELS_DIR"] = str(setup.dev_models)
    try:
        root, seconds = harness.timed(harness.dev_models_dir, quiet=True)
    except Exception as exc:  # the parts that need them report their own error
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    return {"dir": str(root), "s": round(seconds, 1)}


def table(result: dict[str, Any]) -> list[str]:
    """The headline figures, one row each."""
    parts = result["parts"]
    rows = [("part", "figure", "value")]
    for model in ("nano", "super"):
        if model in parts["plan"]:
            plan = parts["plan"][model]
            where = ", ".join(f"{n}: {s['device']}{s['gpus'] or ''}"
                              for n, s in plan["stages"].items())
            rows.append(("plan", f"{model} ({where})", "fits" if plan["fits"] else "NO FIT"))
    for path, got in parts["fp8"].get("engine", {}).items():
        rows.append(("fp8", f"{parts['fp8']['compute']} {path} ms/token", got["ms_per_token"]))
    for key, run in parts["generator"].get("runs", {}).items():
        rows.append(("generator", f"{key} s/step (peak GiB)",
                     f"{run['s_per_step']} ({run['peak_gib']})" if "s_per_step" in run
                     else run["error"][:80]))
    for batch in ("b1", "b4"):
        if batch in parts["reasoner"]:
            got = parts["reasoner"][batch]
            rows.append(("reasoner", f"{batch} ms/token (peak GiB)",
                         f"{got['ms_per_token']} ({got['peak_gib']})"))
    for mode in ("direct", "host_copy"):
        if mode in parts["load"]:
            got = parts["load"][mode]
            rows.append(("load", f"{mode}: host anon peak GiB / s",
                         f"{got['host_anon_peak_gib']} / {got['load_s']}"))
    for run in parts["parallel"].get("runs", []):
        rows.append(("parallel", f"{run['gpus']} GPU {run['layout']} s/step",
                     f"{run['step_s']} (x{run['speedup']})"))
    for name, got in parts.items():
        status = got.get("error", got.get("skipped", "ok"))[:80]
        rows.append((name, "status, seconds", f"{status}, {got.get('part_s', '-')}"))
    width = [max(len(str(r[i])) for r in rows) for i in range(3)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, width)) for r in rows]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, from: {', '.join(PARTS)} (run in that order)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: cuda when torch sees a GPU; cpu: tiny sizes in float32")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="no part starts past this many seconds from the start [450]")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed denoising steps per size [2; cpu 1]")
    parser.add_argument("--frames", type=int, default=None, help="[189; cpu 1]")
    parser.add_argument("--max-tokens", type=int, default=None, help="per reply [48; cpu 6]")
    parser.add_argument("--repeats", type=int, default=None, help="timed replies [2; cpu 1]")
    parser.add_argument("--dev-models", type=Path, default=None,
                        help="where the dev models are (built there when missing) "
                             "[the dev-model cache: WORLDSERVE_DEV_MODELS_DIR or ~/.cache]")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    setup = parser.parse_args(argv)
    setup.names = [n.strip() for n in setup.parts.split(",") if n.strip()]
    unknown = [n for n in setup.names if n not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    import torch

    if setup.device == "auto":
        setup.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif setup.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda but torch {torch.__version__} sees no GPU")
    setup.small = setup.dry_run = setup.device == "cpu"  # dry_run: benchmarks/parallel.py's
    for key, full, small in (("steps", 2, 1), ("frames", 189, 1), ("max_tokens", 48, 6),
                             ("repeats", 2, 1)):
        if getattr(setup, key) is None:
            setattr(setup, key, small if setup.small else full)
    return setup


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    setup = parse(argv)
    result: dict[str, Any] = {"benchmark": "gpu_check", "device": setup.device,
                              "small": setup.small, "budget_s": setup.budget_s,
                              "dev_models": build_dev_models(setup)}
    result["parts"] = run_parts(setup, setup.names, started=started)
    result["total_s"] = round(time.perf_counter() - started, 1)
    result["machine"] = harness.machine()
    for line in table(result):
        print(line, file=sys.stderr)
    harness.emit(result)
    if setup.out is not None:
        setup.out.write_text(json.dumps(result) + "\n")
    return 1 if any("error" in got for got in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
