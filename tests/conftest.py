import os

import pytest
import pytest_twisted
from hypothesis import HealthCheck, settings

# CI runs a fixed, derandomized set of examples so a red build is reproducible;
# locally each run explores new inputs.
settings.register_profile(
    "ci", derandomize=True, max_examples=300, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    # pytest-twisted wraps a hypothesis test's inner_test in place; parametrized items share that
    # function, so without this each parameter would wrap the previous wrapper again.
    hypothesis_handle = getattr(pyfuncitem.obj, "hypothesis", None)
    original = hypothesis_handle.inner_test if hypothesis_handle is not None else None
    yield
    if hypothesis_handle is not None:
        hypothesis_handle.inner_test = original


@pytest.fixture(autouse=True)
def full_log_budget():
    """Each test starts with the peers' log budget unspent (wireproto.peerlog), since every test
    peer is 127.0.0.1."""
    from wireproto.peerlog import BUDGET

    BUDGET.reset()


@pytest_twisted.async_yield_fixture
async def broker():
    """A `tests.brokers.Broker`: the services and clients a test starts, all stopped after it."""
    from tests.brokers import Broker

    running = Broker()
    try:
        yield running
    finally:
        await running.close()


# Shared by every test directory: a serial cable made of two cross-connected pty pairs, and a
# self-signed certificate for localhost (see tests/transports/conftest.py).
from tests.transports.conftest import null_modem, pty_pair, tls_files  # noqa: E402, F401
