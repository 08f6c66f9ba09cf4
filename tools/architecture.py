"""`python -m tools.architecture [--check] [--longest N]`: writes `docs/architecture.md`.

The page is `tools/architecture_template.md` (the hand-written prose) with the room table put in
at `<!-- rooms -->`. The table comes from the tree (each room's files, lines and the rooms it
imports) and from the rules of `tests/unit/test_layering.py` (its floors: a room may import the
floors below it; what a room must not import all the same), so the page and the test cannot
disagree. `--check` exits 1 when the committed page is not what the tree
gives now; `--longest N` prints the N longest files of worldserve/ (for review notes).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit import test_layering as rules

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TEMPLATE = Path(__file__).with_name("architecture_template.md")
MARKER = "<!-- rooms -->"
# Line counts are shown to the hundred so that an ordinary edit does not make the page stale.
LINES_ROUNDING = 100

# What each room is for (the one hand-written column); a room missing here fails the generator.
ROLES: dict[str, str] = {
    "__main__": "`python -m worldserve`: the cli",
    "cli": "the `worldserve` command: `serve`, `check`, `stream`, `realtime`, `dev-models`, ... "
           "(typer)",
    "cluster": "scale-out on Ray Serve (`serve --cluster ray`, docs/scale-out.md): stage "
               "replicas, the owner router, `RayStageClient`, the api as the Serve ingress; "
               "the only package that imports `ray`, imported only by the cli",
    "api": "HTTP/WebSocket routes, schemas, job records, the supervisor launch",
    "engines": "`engines/<stage>/`: scheduling and the stage's request lifecycle: `engine.py` "
               "(submit / step / cancel), a scheduler, the runner `contract.py`; the generation "
               "engine's factory (`generation/factory.py`) starts its rank group when "
               "configured, `generation/levers.py` applies the stage's levers at startup",
    "ranks": "the generation stage as a group of ranks (docs/parallel.md): `group.py` the peer "
             "processes (spawn, join, failure, restart), `runner.py` `RankGroupRunner` (the one "
             "runner the engine sees), `worker.py` a peer (`python -m worldserve.ranks.worker`),"
             " `messages.py` the rank 0 -> peer commands",
    "runtime": "stage process main loop (`stage.py`: `StageLoop.beat()`), supervisor, the "
               "`Engine` protocol and the one engine factory table (`engine.py`), the "
               "in-process stage client (`inprocess.py`), colocated stages' turns "
               "(`colocation.py`), the placement plan (`placement.py`, a pure function; "
               "`checkpoint_facts.py` reads the safetensors headers, `devices.py` lists the "
               "GPUs in a child process: docs/hardware.md)",
    "models": "`models/<family>/`: everything about one architecture (detection, loading, the "
              "runner, the dev checkpoint builder); `registry.py`, `dev/` (seeding, tokenizer, "
              "the `BUILDERS` table), `frames.py`, `camera_keys.py`",
    "levers": "what a stage switches on a loaded model: FP8 weights (`fp8/`), rank-group "
              "collectives and sharding (`parallel/`), step caching (`step_cache.py`), "
              "attention backends and compile (`speed.py`), yield points (`yielding.py`), "
              "modules shared between colocated loaders (`shared.py`), LoRA adapters "
              "(`lora.py`), the runner side of LoRA, weights update and memory release "
              "(`diffusers_admin.py`)",
    "models_shared": "what levers and families both use: `types.py` (types both sides of a "
                     "contract use), `detect.py` (JSON and safetensors-header reads), "
                     "`common.py` (dtype, device, parameter counts)",
    "clients": "the held-out command-line clients",
    "ipc": "wire messages, capabilities (incl. `GenerationDefaults`), codec, transport, the "
           "`StageClient` interface and its ZeroMQ transport",
    "media": "image/video encoding, fetching, framing, the media policy",
    "config": "the settings, validated once and frozen, split as vLLM splits its config: "
              "`server.py`, `loading.py` (device, dtype, FP8, the rank group), `generation.py`, "
              "`reasoner.py`, `realtime.py`; `sources.py` (YAML, environment, overrides); "
              "`flags.py` (the `serve` / `check` flags made from the fields, for the cli only)",
    "enhancer_config": "the prompt enhancer's file",
    "errors": "the error taxonomy -> HTTP status and WebSocket close code, in one table",
    "envs": "every `WORLDSERVE_*` environment variable, read here and nowhere else",
}


@dataclass
class Room:
    name: str
    floor: int
    files: list[str] = field(default_factory=list)
    lines: int = 0
    imports: set[str] = field(default_factory=set)  # rooms it imports now


def where(room: str) -> str:
    """The room's place in the tree."""
    if room == "models_shared":
        return ", ".join(f"`models/{name}.py`" for name in rules.MODEL_SHARED)
    if room == "models":
        return "`models/` (the rest)"
    if (rules.PACKAGE / room).is_dir():
        return f"`{room}/`"
    return f"`{room}.py`"


def collect() -> dict[str, Room]:
    """Every room of worldserve/ with its files, lines and the rooms it imports."""
    rooms = {name: Room(name, floor) for floor, names in enumerate(rules.FLOORS)
             for name in names}
    graph = rules.import_graph()
    for path, _tree in rules.modules():
        module = rules.module_name(path)
        room = rules.room_of(module)
        if room is None:
            continue
        rooms[room].files.append(path)
        rooms[room].lines += len((rules.PACKAGE.parent / path).read_text().splitlines())
        rooms[room].imports |= {rules.room_of(t) for t in graph[module]} - {room, None}
    missing = sorted(set(rooms) - set(ROLES))
    if missing:
        raise SystemExit(f"rooms without a role in tools/architecture.py ROLES: {missing}")
    return {name: room for name, room in rooms.items() if room.files}


def must_not_import(room: str) -> str:
    """What the layering test forbids `room` although it sits on a lower floor (FORBIDDEN
    entries for rooms above it add nothing), and the engines' one window into the models."""
    names = []
    for prefix in rules.FORBIDDEN.get(room, ()):
        if not prefix.startswith("worldserve."):  # a model library
            names.append(f"`{prefix}`")
            continue
        below = {rules.room_of(prefix)} | ({"models_shared"} if prefix == "worldserve.models"
                                           else set())
        if any(rules.floor_of(r) > rules.floor_of(room) for r in below if r is not None):
            names.append(f"`{prefix.removeprefix('worldserve.')}`")
    if room == "engines":
        only = ", ".join(f"`{m.removeprefix('worldserve.')}`" for m in rules.ENGINE_MODEL_IMPORTS)
        names.append(f"any models module but {only}")
    return ", ".join(names) or "—"


def rooms_table(rooms: dict[str, Room]) -> str:
    graph = rules.import_graph()
    rows = ["| floor | room | where | files | lines | role | imports now | must not import "
            "(besides every floor above it) |",
            "|---|---|---|---|---|---|---|---|"]
    for room in sorted(rooms.values(), key=lambda r: (r.floor, r.name)):
        lines = (f"~{round(room.lines / LINES_ROUNDING) * LINES_ROUNDING:,}"
                 if room.lines >= LINES_ROUNDING else str(room.lines))
        imports = ", ".join(sorted(room.imports, key=lambda r: (rooms[r].floor, r))) or "—"
        rows.append(f"| {room.floor + 1} | {room.name} | {where(room.name)} | "
                    f"{len(room.files)} | {lines} | {ROLES[room.name]} | {imports} | "
                    f"{must_not_import(room.name)} |")
    arrows, circles = rules.arrows_up(graph), rules.circles(graph)
    total_files = sum(len(r.files) for r in rooms.values())
    summary = (f"{len(rooms)} rooms on {len({r.floor for r in rooms.values()})} floors, "
               f"{total_files} files; {sum(len(r.imports) for r in rooms.values())} arrows "
               f"between rooms, {len(arrows)} of them back up a floor; "
               f"{len(circles)} import circles.")
    return "\n".join(rows) + "\n\n" + summary


def render() -> str:
    template = TEMPLATE.read_text()
    if MARKER not in template:
        raise SystemExit(f"{TEMPLATE} lacks the {MARKER} line")
    return template.replace(MARKER, rooms_table(collect()))


def longest(n: int) -> list[tuple[int, str]]:
    sizes = [(len((rules.PACKAGE.parent / path).read_text().splitlines()), path)
             for path, _ in rules.modules()]
    return sorted(sizes, reverse=True)[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/architecture.md is stale; write nothing")
    parser.add_argument("--longest", type=int, default=0, metavar="N",
                        help="print the N longest files of worldserve/ and exit")
    args = parser.parse_args(argv)
    if args.longest:
        for lines, path in longest(args.longest):
            print(f"{lines:5d} {path}")
        return 0
    page = render()
    if args.check:
        if DOC.read_text() != page:
            print("docs/architecture.md is stale: run `python -m tools.architecture`")
            return 1
        print("docs/architecture.md is current")
        return 0
    DOC.write_text(page)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
