"""Fixtures shared with the transport tests: `net` tracks and closes what a test opens."""

from tests.transports.conftest import net  # noqa: F401
