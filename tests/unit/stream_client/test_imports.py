"""The client runs on machines without model libraries: it must not import them."""

from __future__ import annotations

import subprocess
import sys

from tests.support.server import REPO_ROOT, base_env


def test_client_imports_no_model_library() -> None:
    code = ("import sys, worldserve.clients.streaming, worldserve.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=base_env(), check=True)
    assert done.stdout.strip() == "[]"
