"""Layering rules of docs/architecture.md over every absolute import statement in worldserve/
(module level, in functions, under TYPE_CHECKING; not `importlib` calls) by an `ast` walk.

The api process must never load model libraries; engines reach models only through the family
registry and the shared types; model families know nothing about scheduling, HTTP or ZeroMQ.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "worldserve"
MODEL_LIBRARIES = ("torch", "transformers", "diffusers")

# layer -> the prefixes it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": (*MODEL_LIBRARIES, "worldserve.engines", "worldserve.models"),
    "engines": ("worldserve.api",),
    "models": ("worldserve.engines", "worldserve.api", "worldserve.runtime"),
    "ipc": ("worldserve.engines", "worldserve.models"),
    "media": ("worldserve.engines", "worldserve.api", "worldserve.models"),
    "clients": ("worldserve.api", "worldserve.engines", "worldserve.models",
                "worldserve.runtime"),
}
# Engines see models only through the registry and the shared types (never a family module).
ENGINE_MODEL_IMPORTS = ("worldserve.models.registry", "worldserve.models.types")
# Known current violations, as (file, imported module). Empty: keep it that way.
ALLOWED: set[tuple[str, str]] = set()
MODEL_BASES = {"Module", "ModelMixin", "PreTrainedModel"}
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
        if layer_of(path) == "models":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in node.bases}
                if bases & MODEL_BASES:
                    found.append(f"{path}: class {node.name}")
    assert not found, "model classes outside worldserve/models/:\n" + "\n".join(found)


def test_the_walk_sees_function_level_imports() -> None:
    tree = ast.parse("def f():\n    from worldserve.api.jobs import enhancer\n")
    assert "worldserve.api.jobs.enhancer" in imported(tree)
