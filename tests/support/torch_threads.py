"""One intra-op torch thread per test: CI machines have 2 busy cores, where one thread is faster
and steadier. A conftest opts in with `from tests.support.torch_threads import one_torch_thread`."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
