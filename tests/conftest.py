import fcntl
import os
import sys
from pathlib import Path

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

# Every Spark JVM the tests start (the shared SparkSession, each `wireproto analyze` child)
# compiles with C1 alone: their jobs are short, and C2's compiler threads took a third of the
# CPU of a `wireproto analyze` here (56 s against 38), which the suite's other workers want.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


# -- parallel workers (pytest-xdist) --------------------------------------------------------------
#
# setup.cfg runs the suite with `-n auto --dist loadgroup --no-loadscope-reorder`: the tests
# mostly wait on sockets and child processes, so more workers than cores keep both cores busy.
# A test marked `xdist_group(NAME)` runs on the same worker as every other test of that group,
# one after another: those that share a SparkSession ("spark", given below to every user of the
# `spark` fixture), those that start a Spark of their own ("own-spark") and those that need the
# default ports ("default-ports", both in tests.support), and those that run alone ("alone",
# below). The workers take the groups and tests in the order of the collection, which puts the
# long Spark groups first and the `alone` tests last (RUN_ORDER).
SUITE_WORKERS = 4
RUN_ORDER = ("own-spark", "spark", "a group", "no group", "alone")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: SUITE_WORKERS for the suite or a directory of it; none (one process, as plain
    pytest) for test files or tests named on the command line. PYTEST_XDIST_AUTO_NUM_WORKERS
    overrides both, and so does any `-n N` given."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if all(argument.split("::")[0].endswith(".py") for argument in config.args):
        return 0
    return SUITE_WORKERS


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
        if item.get_closest_marker("alone") is not None:
            item.add_marker(pytest.mark.xdist_group("alone"))
    if getattr(config.option, "loadgroup", False):  # on a worker of `--dist loadgroup`
        items.sort(key=lambda item: RUN_ORDER.index(_run_order_name(_group(item))))
        for item in items:
            _name_its_group(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    """bench/ holds scripts named like packages the tests import (bench/phyllo.py and the
    phyllo-python package): a test module that puts bench/ ahead of the installed packages on
    sys.path makes every later `import phyllo` find the script. Refuse such a run whole, since the
    tests it breaks depend on which worker collected what."""
    bench = str(Path(__file__).resolve().parent.parent / "bench")
    entries = [str(Path(entry).resolve()) if entry else entry for entry in sys.path]
    installed = [index for index, entry in enumerate(entries) if entry.endswith("site-packages")]
    if bench in entries and installed and entries.index(bench) < installed[0]:
        raise pytest.UsageError(f"a test module put {bench} ahead of the installed packages on "
                                "sys.path, where it shadows them: append it, or load the script "
                                "with importlib")


def _group(item: pytest.Item) -> str:
    return "_".join(sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                            for mark in item.iter_markers("xdist_group")}))


def _run_order_name(group: str) -> str:
    return group if group in RUN_ORDER else "a group" if group else "no group"


def _name_its_group(item: pytest.Item) -> None:
    """The scheduler reads a test's group from its node id, "ID@GROUP". pytest-xdist 3.8 writes
    it where pytest 8 kept the id, which pytest 9.2 no longer reads, so its groups are silently
    ignored (pytest-xdist issue 1386); and it runs before the "spark" marks above. Write it
    where this pytest keeps the id."""
    group = _group(item)
    if not group or item.nodeid.endswith("@" + group):
        return
    named = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest 9.2 and later
        item._id = type(item._id).parse(named)
    else:
        item._nodeid = named
    assert item.nodeid == named, (item.nodeid, named)


# A test marked `alone` bounds in seconds how long the broker keeps a client waiting while it
# works for others, and the other workers' tests would stretch those seconds: it runs while no
# other test of the run does. Each test holds the run's lock, shared, while it runs; an `alone`
# test holds it alone. Each test first passes a gate, which an `alone` test holds closed while
# it waits for the lock, so that it is not kept waiting by tests that start after it asked.
# Consecutive `alone` tests (one group, so one worker) keep both until the last one is done.
_locks: dict[str, int] = {}


def _lock(config: pytest.Config, name: str) -> int | None:
    """A lock file shared by the workers of this run, opened once; None without workers."""
    if not hasattr(config, "workerinput"):
        return None
    if name not in _locks:
        run_directory = Path(config.option.basetemp).parent  # each worker's basetemp is in it
        _locks[name] = os.open(run_directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    return _locks[name]


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    gate, run = _lock(item.config, "gate"), _lock(item.config, "run")
    if gate is None or run is None:
        yield
        return
    if not _alone(item):
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(run, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
        return
    fcntl.flock(gate, fcntl.LOCK_EX)  # held already if the test before was alone too
    fcntl.flock(run, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if not _alone(nextitem):
            fcntl.flock(run, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


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


@pytest.fixture(params=["compiled", "pure"])
def fast_path(request, monkeypatch):
    """Run the test on each fast path in turn (wireproto.speedups): the compiled one, and its
    plain-Python twin. A module whose promises the fast path must keep says
    `pytestmark = pytest.mark.usefixtures("fast_path")`. Without the compiled path built, its
    runs are skipped (tests/speedups/test_build.py fails them under CI=true instead).
    Brokers the test starts as processes take the same path (WIREPROTO_PURE_PYTHON)."""
    from wireproto import speedups

    if request.param == "compiled" and not speedups.compiled_available():
        pytest.skip("the compiled fast path is not built (make speedups)")
    if request.param == "pure":
        monkeypatch.setenv("WIREPROTO_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("WIREPROTO_PURE_PYTHON", raising=False)
    before = speedups.implementation
    speedups.use(request.param)
    try:
        yield request.param
    finally:
        speedups.use(before)


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
