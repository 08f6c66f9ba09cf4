"""The mutation check (`make test` runs it after the suite): every planted bug of `plants.py`
is caught by each test that claims to cover it, and those tests pass without the plant.

Each plant runs its covering tests in one pytest process on a copy of the project with the
plant applied; it passes when every one of them fails on an assertion (a collection or fixture
error would say nothing about the plant, so it counts as not caught).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutations import mutate
from tests.mutations.plants import PLANTS, Plant


class Projects:
    """One copy of the project per plant (made on first use), and one unplanted copy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def get(self, plant: Plant | None) -> Path:
        name = plant.name if plant is not None else "unplanted"
        if name not in self.made:
            project = mutate.copy_project(self.root / name)
            if plant is not None:
                mutate.apply(plant, project)
            self.made[name] = project
        return self.made[name]


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Projects:
    return Projects(tmp_path_factory.mktemp("mutations"))


def test_plant_names_are_unique_and_each_plant_is_covered() -> None:
    names = [p.name for p in PLANTS]
    assert len(names) == len(set(names))
    assert all(p.caught_by for p in PLANTS)


@pytest.mark.parametrize("plant", PLANTS, ids=[p.name for p in PLANTS])
def test_every_anchor_occurs_once_in_the_working_tree(plant: Plant) -> None:
    text = (mutate.REPO_ROOT / plant.path).read_text(encoding="utf-8")
    assert text.count(plant.anchor) == 1, (
        f"plant {plant.name!r}: anchor found {text.count(plant.anchor)} times in {plant.path}; "
        "the code moved: re-anchor the plant in tests/mutations/plants.py")


def test_a_missing_anchor_fails_loudly(tmp_path: Path) -> None:
    (tmp_path / "worldserve").mkdir()
    (tmp_path / "worldserve" / "m.py").write_text("x = 1\n")
    moved = Plant("moved", "a claim", "worldserve/m.py", "x = 2\n", "x = 3\n", ("t",))
    with pytest.raises(mutate.AnchorNotFound, match="'moved': its anchor occurs 0 times"):
        mutate.apply(moved, tmp_path)
    gone = Plant("gone", "a claim", "worldserve/gone.py", "x", "y", ("t",))
    with pytest.raises(mutate.AnchorNotFound, match="does not exist"):
        mutate.apply(gone, tmp_path)


def test_covering_tests_pass_without_plants(projects: Projects) -> None:
    project = projects.get(None)
    nodes = sorted({node for plant in PLANTS for node in plant.caught_by})
    outcome = mutate.run_tests(project, nodes)
    assert outcome.returncode == 0, outcome.output


@pytest.mark.parametrize("plant", PLANTS, ids=[p.name for p in PLANTS])
def test_plant_is_caught_by_every_test_claiming_it(projects: Projects, plant: Plant) -> None:
    outcome = mutate.run_tests(projects.get(plant), list(plant.caught_by))
    missed = [node for node in plant.caught_by if not mutate.failed_in(outcome, node)]
    assert not missed and not outcome.errored, (
        f"plant {plant.name!r} ({plant.claim}) was not caught by {missed}:\n"
        f"failed {outcome.failed}, errors {outcome.errored}\n{outcome.output}")
