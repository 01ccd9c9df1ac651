"""The tools' tests' fixtures: the processes a test starts, and the [auth] files."""

from collections.abc import AsyncIterator

import pytest_twisted

from tests.access.conftest import auth_files  # noqa: F401
from tests.tools.served import Processes


@pytest_twisted.async_yield_fixture
async def processes() -> AsyncIterator[Processes]:
    """Every process the test starts (`Processes.run`, `Processes.serve`), killed at its end."""
    running = Processes()
    try:
        yield running
    finally:
        running.kill()
