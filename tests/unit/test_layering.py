"""Layering rules of docs/architecture.md over every absolute import statement in worldserve/
(module level, in functions, under TYPE_CHECKING; not `importlib` calls) by an `ast` walk.

The package is a stack of rooms on floors (`FLOORS`): a room imports only rooms on the floors
below it, so no arrow runs back up. On top of that, `FORBIDDEN` names what a room must not
import although it sits above it: the api process must never load model libraries; engines
reach models only through the family registry and the shared types; model families know
nothing about scheduling, HTTP or ZeroMQ. No module imports itself through others (no import
circles). The api and the engines read what a family declares and never spell a family's name
(issue 21). These tables are the one source of docs/architecture.md's room table
(`python -m tools.architecture`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from worldserve.models import registry

PACKAGE = Path(__file__).resolve().parents[2] / "worldserve"
MODEL_LIBRARIES = ("torch", "transformers", "diffusers")

# The rooms of worldserve/, top floor first: a folder is a room, a top-level module is a room,
# and models/ is two: the families (with the registry and the dev builders) above the levers,
# and the few shared modules (`MODEL_SHARED`) that levers and families both use below them.
# Rooms on one floor do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("clients",),
    ("cluster",),
    ("api",),
    ("engines",),
    ("ranks",),
    ("runtime",),
    ("models",),
    ("levers",),
    ("models_shared",),
    ("ipc", "media"),
    ("config", "enhancer_config", "errors"),
    ("envs",),
)
MODEL_SHARED = ("types", "detect", "common")
# room -> the prefixes it must not import although they sit on lower floors (and model
# libraries it must not import at all)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": (*MODEL_LIBRARIES, "worldserve.engines", "worldserve.models", "worldserve.ranks",
            "worldserve.levers"),
    "engines": ("worldserve.api", "worldserve.levers"),
    "ranks": ("worldserve.api", "worldserve.engines", "worldserve.cluster"),
    "models": ("worldserve.engines", "worldserve.api", "worldserve.runtime", "worldserve.ranks"),
    "ipc": ("worldserve.engines", "worldserve.models", "worldserve.ranks"),
    "media": ("worldserve.engines", "worldserve.api", "worldserve.models"),
    "clients": ("worldserve.api", "worldserve.engines", "worldserve.models",
                "worldserve.runtime"),
    # Config is read by every process: it knows settings, never what acts on them.
    "config": (*MODEL_LIBRARIES, "worldserve.api", "worldserve.engines", "worldserve.models",
               "worldserve.runtime", "worldserve.ipc", "worldserve.media", "worldserve.cluster"),
}
# Engines see models only through the registry and the shared types (never a family module).
ENGINE_MODEL_IMPORTS = ("worldserve.models.registry", "worldserve.models.types")
# Known current violations, as (file, imported module). Empty: keep it that way.
ALLOWED: set[tuple[str, str]] = set()
MODEL_BASES = {"Module", "ModelMixin", "PreTrainedModel"}
# Where model classes may live: the families, and the levers' layers (an FP8 linear).
MODEL_LAYERS = ("models", "levers")
# Ray (scale-out, extra worldserve[ray]) is imported only here; the cli reaches it only through
# worldserve.cluster, under `--cluster ray`.
RAY_IMPORTERS = ("worldserve/cluster/",)


def modules() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(PACKAGE.parent)), ast.parse(path.read_text(), str(path)))
            for path in sorted(PACKAGE.rglob("*.py"))]


def imported(tree: ast.Module) -> list[str]:
    """Every module an import statement anywhere in `tree` names (`from a import b` -> a, a.b)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def layer_of(path: str) -> str | None:
    parts = Path(path).parts  # ("worldserve", "<layer>", ...)
    return parts[1] if len(parts) > 2 else None


def room_of(module: str) -> str | None:
    """The room of a worldserve module (`worldserve.models.types` -> "models_shared"); None for
    the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] == "models" and len(parts) > 2 and parts[2] in MODEL_SHARED:
        return "models_shared"
    return parts[1]


def floor_of(room: str) -> int:
    """0 for the top floor; a room missing from FLOORS is a KeyError (give it a floor)."""
    return {r: i for i, rooms in enumerate(FLOORS) for r in rooms}[room]


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_import_rules_hold() -> None:
    broken = []
    for path, tree in modules():
        forbidden = FORBIDDEN.get(layer_of(path) or "", ())
        for name in imported(tree):
            bad = any(matches(name, prefix) for prefix in forbidden)
            if layer_of(path) == "engines" and matches(name, "worldserve.models"):
                bad = bad or not any(matches(name, ok) or ok.startswith(name + ".")
                                     for ok in ENGINE_MODEL_IMPORTS)
            if bad and (path, name) not in ALLOWED:
                broken.append(f"{path} imports {name}")
    assert not broken, "layering broken:\n" + "\n".join(sorted(set(broken)))


def test_only_the_cluster_package_imports_ray() -> None:
    found = [f"{path} imports {name}" for path, tree in modules()
             if not path.startswith(RAY_IMPORTERS)
             for name in imported(tree) if matches(name, "ray")]
    assert not found, "ray imported outside worldserve/cluster/:\n" + "\n".join(found)


def test_nothing_but_the_cli_imports_the_cluster_package() -> None:
    found = [f"{path} imports {name}" for path, tree in modules()
             if not path.startswith(RAY_IMPORTERS) and path != "worldserve/cli.py"
             for name in imported(tree) if matches(name, "worldserve.cluster")]
    assert not found, "worldserve.cluster imported outside the cli:\n" + "\n".join(found)


def test_model_classes_live_under_models() -> None:
    found = []
    for path, tree in modules():
        if layer_of(path) in MODEL_LAYERS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in node.bases}
                if bases & MODEL_BASES:
                    found.append(f"{path}: class {node.name}")
    assert not found, ("model classes outside worldserve/models/ and worldserve/levers/:\n"
                       + "\n".join(found))


def test_the_walk_sees_function_level_imports() -> None:
    tree = ast.parse("def f():\n    from worldserve.api.jobs import enhancer\n")
    assert "worldserve.api.jobs.enhancer" in imported(tree)


# ---------------------------------------------------------------- import circles


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the worldserve modules it imports (anywhere in the file)."""
    trees = {module_name(path): tree for path, tree in modules()}
    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        names = imported(tree)
        graph[name] = {n for n in names if n in trees and n != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a room to a room on its own floor or a higher one."""
    found = []
    for name, targets in graph.items():
        src = room_of(name)
        for target in sorted(targets):
            dst = room_of(target)
            if None in (src, dst) or src == dst:
                continue
            if floor_of(dst) <= floor_of(src):  # type: ignore[arg-type]
                found.append(f"{name} ({src}) imports {target} ({dst})")
    return found


def test_every_room_has_a_floor() -> None:
    rooms = {room_of(module_name(path)) for path, _ in modules()} - {None}
    floored = {room for floor in FLOORS for room in floor}
    assert rooms <= floored, f"rooms without a floor in FLOORS: {sorted(rooms - floored)}"


def test_no_arrow_runs_back_up() -> None:
    found = arrows_up(import_graph())
    assert not found, "imports up or sideways a floor:\n" + "\n".join(found)


def test_the_floor_check_finds_an_arrow_up() -> None:
    graph = {"worldserve.runtime.x": {"worldserve.engines.y", "worldserve.models.types"},
             "worldserve.models.cosmos3.z": {"worldserve.levers.speed"},
             "worldserve.levers.speed": {"worldserve.models.types"}}
    assert arrows_up(graph) == ["worldserve.runtime.x (runtime) imports worldserve.engines.y "
                                "(engines)"]


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


# ---------------------------------------------------------------- family names

# The registry's family names, and the short names and aliases the families go by.
FAMILY_ALIASES = ("cosmos", "qwen", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "sana", "lingbot",
                  "self_forcing", "helios", "anyflow")
FAMILY_NAMES = tuple(sorted({family.name for family in registry.FAMILIES} | set(FAMILY_ALIASES)))
FAMILY_WORD = re.compile(r"(?<![a-z0-9])(" + "|".join(FAMILY_NAMES) + r")(?![a-z0-9])",
                         re.IGNORECASE)
FAMILY_FREE_LAYERS = ("api", "engines")
# Literals that spell a family name but are not one, as (file, literal).
NOT_A_FAMILY: set[tuple[str, str]] = {
    # a field of the /admin/model_info answer (the action head's shapes), not a family branch
    ("worldserve/engines/generation/admin.py", "action_head"),
    # a key of vLLM-Omni's realtime wire (`extra_params.sana_wm.action`), mapped for any model
    ("worldserve/api/realtime/omni_mapping.py", "sana_wm"),
}
def docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)}


def compared_strings(tree: ast.Module) -> set[int]:
    """String constants that are compared or matched on (`== "x"`, `in ("x", ...)`, `case "x"`)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        for operand in operands:
            found |= {id(c) for c in ast.walk(operand) if isinstance(c, ast.Constant)}
    return found


def family_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, literal) of every string that is a family name, or names one in a comparison."""
    skip, compared = docstrings(tree), compared_strings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in skip:
            continue
        named = node.value.strip().lower() in FAMILY_NAMES
        if named or (id(node) in compared and FAMILY_WORD.search(node.value)):
            found.append((node.lineno, node.value))
    return found


def test_api_and_engines_never_spell_a_family_name() -> None:
    found = [f"{path}:{line}: {value!r}" for path, tree in modules()
             if layer_of(path) in FAMILY_FREE_LAYERS
             for line, value in family_literals(tree) if (path, value) not in NOT_A_FAMILY]
    assert not found, ("family names in api/ or engines/ (branch on a declared capability "
                       "instead):\n" + "\n".join(found))


def test_the_family_check_sees_branches_and_tables() -> None:
    tree = ast.parse('"""About Wan."""\n'
                     'TABLE = {"cosmos3": 1}\n'
                     'if caps.family == "Wan": pass\n'
                     'if name in ("a", "qwen_vl"): pass\n'
                     'ok = "refused on this model"\n'
                     'prose = "a Wan 2.2 LoRA file"\n')
    assert [value for _, value in family_literals(tree)] == ["cosmos3", "Wan", "qwen_vl"]
    assert {"cosmos3", "wan", "qwen_vl", "sana_wm", "causal_dit"} <= set(FAMILY_NAMES)
