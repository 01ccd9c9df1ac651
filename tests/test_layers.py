"""The layers of wireproto, read from the import graph (docs/architecture.md draws them).

Every ``import`` in ``wireproto/`` counts: inside functions, and under ``if TYPE_CHECKING:`` too,
since a type named is a dependency as much as a function called. So does every string that
names a module of wireproto as a descriptor does (``"wireproto.protocols.ubre.server:serve"``,
``"wireproto.cluster.analysis"``), since it is imported when used; a docstring and a logger's
namespace are not. The codecs are also checked at run time: a fresh interpreter imports each
one and must not have loaded Twisted or any networking module.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

import wireproto
import wireproto.codecs

PACKAGE = Path(wireproto.__file__).parent


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


DESCRIPTOR = re.compile(r"(wireproto(?:\.\w+)+)(?::[\w.]+)?")


def _not_imports(tree: ast.AST) -> set[int]:
    """The string constants of `tree` that name no dependency: docstrings and loggers'
    namespaces."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "namespace":
            skipped.add(id(node.value))
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))
    return skipped


def imports_of(name: str, source: str, modules: Mapping[str, Path]) -> set[str]:
    """The wireproto modules that module `name` imports or names as a descriptor does:
    ``from a import b`` is a.b when that is a module, else a."""
    is_package = modules[name].name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(source)
    skipped = _not_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skipped:
            named = DESCRIPTOR.fullmatch(node.value)
            if named is not None:
                found.add(named.group(1))
    return {target for target in found if target in modules and target != name}


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path.read_text(), modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


# What each layer may import of wireproto; everything else of wireproto is refused.
FOUNDATION = (
    "wireproto.errors", "wireproto.peerlog", "wireproto.topics", "wireproto.settings",
    "wireproto.payloads", "wireproto.redaction", "wireproto.logs", "wireproto.lazy",
    "wireproto.speedups",
)
TRANSPORT_INTERFACE = (
    "wireproto.transports",  # the package's public names
    "wireproto.transports.base",  # what a protocol implements and is given
    "wireproto.transports.connect",  # how a client reaches a peer
    "wireproto.transports.reconnect",
)
def _allowed(*prefixes: str, exact: Iterable[str] = ()) -> Callable[[str], bool]:
    exact = frozenset(exact)
    return lambda target: target in exact or within(target, *prefixes)


RULES: dict[str, tuple[str, Callable[[str], bool]]] = {
    **{module: ("the foundation imports only the foundation and the codecs",
                _allowed("wireproto.codecs", exact=FOUNDATION)) for module in FOUNDATION},
    "wireproto.speedups": (
        "the fast path (compiled, or its plain-Python twin) imports only itself: any layer "
        "may run on it",
        _allowed("wireproto.speedups"),
    ),
    "wireproto.access": (
        "the access policy is sans-IO: it imports only itself, topics, errors and settings "
        "(which declare its [limits] table and import nothing of wireproto)",
        _allowed("wireproto.access",
                 exact=("wireproto.topics", "wireproto.errors", "wireproto.settings")),
    ),
    "wireproto.codecs": (
        "codecs import only codecs and errors",
        _allowed("wireproto.codecs", "wireproto.errors"),
    ),
    "wireproto.transports": (
        "transports import neither the hub, nor capture, nor protocols, config or service "
        "(of the access policy, sans-IO, they know who a peer is; of the devices, which port "
        "a serial board is on)",
        _allowed("wireproto.transports", "wireproto.codecs", "wireproto.access",
                 "wireproto.devices", *FOUNDATION),
    ),
    "wireproto.devices": (
        "the devices (ports, identities, the watch for boards) import only themselves and the "
        "foundation: the transports, config and the service ask them",
        _allowed("wireproto.devices", exact=FOUNDATION),
    ),
    "wireproto.protocols": (
        "protocols import the transports only through their interface, and nothing above "
        "them; their registry names the cluster's analysis of its capture records and the "
        "tools' links to each protocol, as descriptor strings",
        lambda target: target in ("wireproto.cluster.analysis", "wireproto.tools.links",
                                  "wireproto.tools.callers") or (
            not within(target, "wireproto.transports") or target in TRANSPORT_INTERFACE
        ) and not within(target, "wireproto.config", "wireproto.service", "wireproto.cli",
                         "wireproto.tools", "wireproto.pipeline", "wireproto.capture",
                         "wireproto.cluster", "wireproto.supervisor", "wireproto.admin",
                         "wireproto.metrics", "wireproto.broker"),
    ),
    "wireproto.phyllo": (
        "the Phyllo layers and bridge import neither capture, config, the service nor the tools",
        lambda target: not within(target, "wireproto.capture", "wireproto.config",
                                  "wireproto.service", "wireproto.cli", "wireproto.tools",
                                  "wireproto.pipeline"),
    ),
    "wireproto.pipeline": (
        "the pipeline imports neither the CLI nor the service, nor any transport",
        lambda target: not within(target, "wireproto.cli", "wireproto.service",
                                  "wireproto.transports", "wireproto.tools"),
    ),
    "wireproto.pipeline.tablestore": (
        "the table store (uploads, copies, tidying) runs without Spark: it imports only how "
        "capture files are stored",
        _allowed(exact=("wireproto.capture.storage",)),
    ),
    "wireproto.pipeline.jobs": (
        "the analysis jobs know the rows' columns and the protocol descriptors, not where the "
        "rows come from: no capture files, storage, data source, table or command",
        _allowed(exact=("wireproto.protocols", "wireproto.pipeline.values")),
    ),
    "wireproto.pipeline.table": (
        "the table's contract imports the rows' schema, capture storage, wireproto's version "
        "and the table store, never a job or a command that uses it",
        _allowed(exact=("wireproto", "wireproto.pipeline.rows", "wireproto.capture.storage",
                        "wireproto.pipeline.tablestore")),
    ),
    "wireproto.pipeline.ingest": (
        "the ingest query imports the table, the data source and the table store (to tidy), "
        "never a command",
        _allowed(exact=("wireproto.pipeline.table", "wireproto.pipeline.datasource",
                        "wireproto.pipeline.tablestore")),
    ),
    "wireproto.output": (
        "the program's stdout imports nothing of wireproto",
        _allowed(exact=("wireproto.output",)),
    ),
    "wireproto.stopping": (
        "how the program stops on its signals imports nothing of wireproto",
        _allowed(exact=("wireproto.stopping",)),
    ),
    "wireproto.program": (
        "the program's name and logging set-up import only the [log] table's settings and "
        "the log's form",
        _allowed(exact=("wireproto.program", "wireproto.config.tables", "wireproto.logs")),
    ),
    "wireproto.supervisor": (
        "the supervisor imports the service, config, the cluster, the transports, the "
        "program's name and logging set-up, the foundation and the version (wireproto's "
        "__version__, for its build info), never the CLI",
        _allowed("wireproto.supervisor", "wireproto.service", "wireproto.config",
                 "wireproto.cluster", "wireproto.transports",
                 exact=("wireproto", "wireproto.program", *FOUNDATION)),
    ),
    "wireproto.hub": (
        "the hub imports the foundation, access, the codecs, the transports' interface and the "
        "call contract: a federation is what it is told (wireproto.hub.federation), never the "
        "cluster",
        _allowed("wireproto.hub", "wireproto.access", "wireproto.codecs",
                 exact=(*FOUNDATION, *TRANSPORT_INTERFACE, "wireproto.protocols.calls")),
    ),
    "wireproto.cluster": (
        "the cluster imports the hub, access, the codecs, capture's records, the call contract "
        "and RPC plumbing, the transports and the foundation; never a protocol server, the "
        "service, config, admin, metrics, the tools or the pipeline",
        _allowed("wireproto.cluster", "wireproto.hub", "wireproto.access", "wireproto.codecs",
                 "wireproto.capture", "wireproto.transports",
                 exact=(*FOUNDATION, "wireproto.protocols.calls", "wireproto.protocols.rpc")),
    ),
    **{layer: (f"{what} see the broker through wireproto.broker and the hub's federation: "
               "never the service, the cluster, the supervisor, config, the CLI or the tools",
               lambda target: not within(target, "wireproto.service", "wireproto.cluster",
                                         "wireproto.supervisor", "wireproto.config",
                                         "wireproto.cli", "wireproto.tools",
                                         "wireproto.pipeline"))
       for layer, what in (("wireproto.admin", "admin"), ("wireproto.metrics", "metrics"))},
    "wireproto.broker": (
        "the broker's view names what it shows, never the service that shows it",
        lambda target: not within(target, "wireproto.service", "wireproto.cli",
                                  "wireproto.supervisor", "wireproto.admin", "wireproto.metrics"),
    ),
    "wireproto.config": (
        "config reads the settings of every part, but never the service, the CLI, the "
        "supervisor, the tools or the pipeline",
        lambda target: not within(target, "wireproto.service", "wireproto.cli",
                                  "wireproto.supervisor", "wireproto.tools",
                                  "wireproto.pipeline", "wireproto.broker"),
    ),
    "wireproto.service": (
        "the service assembles the broker: never the CLI, the supervisor (which runs it in "
        "workers), the tools or the pipeline",
        lambda target: not within(target, "wireproto.cli", "wireproto.supervisor",
                                  "wireproto.tools", "wireproto.pipeline"),
    ),
    "wireproto.tools": (
        "the tools are clients: never the hub's server side, the service, config, the "
        "cluster, the supervisor, admin, metrics or the pipeline",
        lambda target: not within(target, "wireproto.service", "wireproto.config",
                                  "wireproto.cluster", "wireproto.supervisor", "wireproto.admin",
                                  "wireproto.metrics", "wireproto.pipeline", "wireproto.cli",
                                  "wireproto.broker"),
    ),
    "wireproto.conformance": (
        "the conformance kits judge another implementation from outside: codecs, the client "
        "side of transports and protocols, and the tools' shared options; never the hub, the "
        "service, config, the cluster, the supervisor, admin, metrics, capture or the pipeline",
        lambda target: not within(target, "wireproto.hub", "wireproto.service",
                                  "wireproto.config", "wireproto.cluster",
                                  "wireproto.supervisor", "wireproto.admin", "wireproto.metrics",
                                  "wireproto.capture", "wireproto.pipeline", "wireproto.cli",
                                  "wireproto.broker"),
    ),
    "wireproto.capture": (
        "capture wraps connections and writes records: never the service, config, the "
        "cluster, admin, metrics, the tools, the pipeline or the CLI",
        lambda target: not within(target, "wireproto.service", "wireproto.config",
                                  "wireproto.cluster", "wireproto.supervisor", "wireproto.admin",
                                  "wireproto.metrics", "wireproto.tools", "wireproto.pipeline",
                                  "wireproto.cli", "wireproto.broker"),
    ),
    **{layer: (f"{what} never imports the service, the CLI, the supervisor, config, the "
               "cluster, admin, metrics, the tools or the pipeline",
               lambda target: not within(target, "wireproto.service", "wireproto.cli",
                                         "wireproto.supervisor", "wireproto.config",
                                         "wireproto.cluster", "wireproto.admin",
                                         "wireproto.metrics", "wireproto.tools",
                                         "wireproto.pipeline", "wireproto.broker"))
       for layer, what in (("wireproto.authentication", "authentication"),
                           ("wireproto.limits", "the connection limits"))},
}

# Every module of wireproto is under a rule, but these, which are above every layer.
TOP = ("wireproto", "wireproto.__main__", "wireproto.cli")


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    found = []
    for name, targets in sorted(graph.items()):
        for layer, (rule, allowed) in RULES.items():
            if not within(name, layer):
                continue
            for target in sorted(targets):
                if not allowed(target):
                    found.append(f"{name} imports {target}: {rule}")
    return found


GRAPH = import_graph(module_files())


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_each_layer_imports_only_what_it_may():
    assert violations(GRAPH) == []


def test_every_module_is_under_a_rule():
    assert [name for name in sorted(GRAPH)
            if name not in TOP and not any(within(name, layer) for layer in RULES)] == []


def test_the_checks_can_fail():
    graph = {
        "wireproto.codecs.x": {"wireproto.hub"},
        "wireproto.transports.y": {"wireproto.hub", "wireproto.transports.base"},
        "wireproto.protocols.z": {"wireproto.transports.stream", "wireproto.transports.base"},
        "wireproto.pipeline.w": {"wireproto.cli"},
        "wireproto.cli": {"wireproto.pipeline.w"},
        "wireproto.program": {"wireproto.config"},
        "wireproto.supervisor.v": {"wireproto.cli", "wireproto.config", "wireproto.cluster",
                                   "wireproto.program", "wireproto.hub"},
        "wireproto.service": {"wireproto.supervisor.v"},
        "wireproto.cluster.u": {"wireproto.supervisor"},
        "wireproto.hub.t": {"wireproto.cluster.link", "wireproto.protocols.calls"},
        "wireproto.admin.s": {"wireproto.service", "wireproto.broker"},
        "wireproto.metrics": {"wireproto.cluster"},
        "wireproto.tools.r": {"wireproto.config"},
        "wireproto.capture.q": {"wireproto.pipeline"},
        "wireproto.config.p": {"wireproto.service"},
    }
    assert cycles(graph) == [["wireproto.cli", "wireproto.pipeline.w"]]
    assert [line.split(":")[0] for line in violations(graph)] == [
        "wireproto.admin.s imports wireproto.service",
        "wireproto.capture.q imports wireproto.pipeline",
        "wireproto.cluster.u imports wireproto.supervisor",
        "wireproto.codecs.x imports wireproto.hub",
        "wireproto.config.p imports wireproto.service",
        "wireproto.hub.t imports wireproto.cluster.link",
        "wireproto.metrics imports wireproto.cluster",
        "wireproto.pipeline.w imports wireproto.cli",
        "wireproto.program imports wireproto.config",
        "wireproto.protocols.z imports wireproto.transports.stream",
        "wireproto.service imports wireproto.supervisor.v",
        "wireproto.supervisor.v imports wireproto.cli",
        "wireproto.supervisor.v imports wireproto.hub",
        "wireproto.tools.r imports wireproto.config",
        "wireproto.transports.y imports wireproto.hub",
    ]


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path):
    package = tmp_path / "wireproto"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from wireproto.sub import b\n")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "sub" / "b.py").write_text("from ..a import f\n")
    graph = import_graph(module_files(package))
    assert graph["wireproto.a"] == {"wireproto.sub.b"}
    assert graph["wireproto.sub"] == {"wireproto.sub.b"}
    assert graph["wireproto.sub.b"] == {"wireproto.a"}


def test_type_imports_and_descriptor_strings_count_but_docstrings_and_loggers_do_not(tmp_path):
    package = tmp_path / "wireproto"
    package.mkdir()
    for name in ("__init__", "a", "b", "c", "d", "e"):
        (package / f"{name}.py").write_text("")
    (package / "user.py").write_text(
        '"""Names wireproto.e in its docstring."""\n'
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from wireproto.a import Thing\n"
        'SERVE = "wireproto.b:serve"\n'
        'ANALYSIS = "wireproto.c"\n'
        'log = Logger(namespace="wireproto.d")\n'
    )
    graph = import_graph(module_files(package))
    assert graph["wireproto.user"] == {"wireproto.a", "wireproto.b", "wireproto.c"}


# -- the codecs at run time -----------------------------------------------------------------------

CODECS = sorted(module.name for module in pkgutil.iter_modules(wireproto.codecs.__path__))
SPEC_CODECS = [name for name in CODECS if name != "serialization"]
IO_MODULES = ("twisted", "autobahn", "serial", "socket", "asyncio", "selectors")


def _loaded_io_modules(module: str) -> str:
    probe = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {IO_MODULES!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True)
    return result.stdout.strip()


@pytest.mark.parametrize("name", CODECS)
def test_codec_imports_no_io(name):
    assert _loaded_io_modules(f"wireproto.codecs.{name}") == ""


@pytest.mark.parametrize("module", ["wireproto.access", "wireproto.access.quotas"])
def test_the_access_policy_imports_no_io(module):
    assert _loaded_io_modules(module) == ""


def test_the_probe_sees_an_io_import():
    assert "twisted" in _loaded_io_modules("twisted.internet.protocol").split(",")


def incremental_decoders(module: object) -> set[type]:
    """The codec's own classes in a module that decode bytes as they arrive: those with `feed`."""
    return {cls for name, cls in vars(module).items()
            if not name.startswith("_") and isinstance(cls, type)
            and cls.__module__.startswith("wireproto.codecs") and hasattr(cls, "feed")}


@pytest.mark.parametrize("name", SPEC_CODECS)
def test_codec_exposes_encode_and_decode(name):
    module = importlib.import_module(f"wireproto.codecs.{name}")
    assert callable(module.encode) and callable(module.decode)


@pytest.mark.parametrize("name", SPEC_CODECS)
def test_an_incremental_codec_names_its_decoder(name):
    """A codec of a byte stream, where one read may end inside a message or hold several, has
    `decode` for a whole buffer and names its incremental decoder `Decoder`, whose `feed` returns
    what the bytes so far complete; a codec with no such class names none."""
    module = importlib.import_module(f"wireproto.codecs.{name}")
    found = incremental_decoders(module)
    if not found:
        assert not hasattr(module, "Decoder")
        return
    assert getattr(module, "Decoder", None) in found, f"{name}.Decoder is none of {found}"
    assert "Decoder" in module.__all__
    assert module.Decoder().feed(b"") == []


def test_the_convention_sees_a_codec_that_does_not_name_its_decoder():
    class Splitter:
        def feed(self, data: bytes) -> list[bytes]:
            return []

    Splitter.__module__ = "wireproto.codecs.made_up"
    codec = types.ModuleType("wireproto.codecs.made_up")
    codec.Splitter, codec.encode = Splitter, len  # type: ignore[attr-defined]
    assert incremental_decoders(codec) == {Splitter}
    assert getattr(codec, "Decoder", None) not in incremental_decoders(codec)


# -- the size of a module -------------------------------------------------------------------------

MAX_MODULE_LINES = 650
# Modules that may be longer, because each reads top to bottom as one spec's text.
READS_AS_ONE_SPEC = {
    "wireproto.codecs.subble": "the SubbleSocket spec: its codes, messages, decoding, encoding",
}


def test_no_module_is_over_650_lines_but_one_that_reads_as_one_spec():
    lines = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    assert {name: count for name, count in lines.items()
            if count > MAX_MODULE_LINES and name not in READS_AS_ONE_SPEC} == {}
    assert set(READS_AS_ONE_SPEC) <= set(lines)
