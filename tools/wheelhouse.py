"""`make wheelhouse`'s requirement list: requirements/lock.txt without what a GPU host brings
with its own CUDA torch (torch, triton and the CUDA runtime wheels: `nvidia-*`, `cuda-*`).
Kept: every other pinned package, the extras' too, and ModelOpt (`nvidia-modelopt`, the fp8
extra) and `nvidia-ml-py`, which are pure Python. Standard library only: it runs in the bare
venv `make` creates before anything is installed.

    python -m tools.wheelhouse [requirements/lock.txt]    # one `name==version` a line
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HOST_TORCH = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")
PURE_PYTHON_NVIDIA = {"nvidia-modelopt", "nvidia-ml-py"}


def _name(requirement: str) -> str:
    """The normalised project name of `name==version` (PEP 503: lower case, runs of -_. as -)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0]).lower()


def requirements(lock_text: str) -> list[str]:
    """The lock's pins a host with its own CUDA torch still needs, in the lock's order."""
    kept = []
    for line in lock_text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        name = _name(line)
        if HOST_TORCH.match(name) and name not in PURE_PYTHON_NVIDIA:
            continue
        kept.append(line)
    return kept


def main(argv: list[str]) -> int:
    lock = Path(argv[0] if argv else "requirements/lock.txt")
    print("\n".join(requirements(lock.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
