"""An application under ``wireproto serve --app``: its handlers in every broker process.

`setup` is called with the broker (a `WireprotoService`) in each of its processes, before it
starts: once under ``wireproto serve``, in each worker under ``--workers N``, once under
``twistd wireproto``. It registers:

- a UBRE handler, ``add``;
- a nydus route, ``/rooms/:room/join``;
- a SubbleSocket hook that refuses a reading without a number of degrees, and a server event,
  ``alerts``, that the hub callback below publishes;
- a hub callback on the ``readings`` topic, which publishes an alert for a hot room.

Each answer names the process that gave it (`service.node`), to show that every worker answers.
Serve it from this directory with ``wireproto serve --app app:setup`` (the current directory is
importable, as with ``python -m``), or ``wireproto serve --app app:setup --workers 2``.

Run ``python examples/app.py`` to do that and call each of them from clients, connecting until
both workers have answered. It prints:

    ready: 2 workers
    ubre add [1, 2] -> 3, answered by both workers
    nydus /rooms/lobby/join -> {'joined': 'lobby'}, answered by both workers
    subble alert from app: {'room': 'kitchen', 'celsius': 35}
    subble refused a reading: event 'readings' was not created: celsius must be a number
    stopped
"""

import json

import msgpack

from wireproto.errors import InvalidField


def setup(service):
    """Register this application's handlers on the broker `service` (wireproto serve --app)."""
    node = service.node  # this process, as the cluster names it

    @service.server("ubre").handle("add")
    def add(numbers, peer):
        return {"sum": sum(numbers), "node": node}

    @service.server("nydus").register_route("/rooms/:room/join")
    def join(call):
        return {"joined": call.params["room"], "node": node}

    subble = service.server("subble")

    def check_reading(client, event_type, payload, format):
        # Raising refuses the event: its producer gets error 52, with this text for an
        # InvalidField (a ProtocolError); anything else is logged as the host's own failure.
        if event_type == "readings" and _celsius(
                json.loads(payload) if format == 1 else msgpack.unpackb(payload)) is None:
            raise InvalidField("celsius must be a number")

    subble.on_event = check_reading

    def reading(message):
        # With --workers, every process that follows `readings` sees each reading, wherever it
        # was published: act on those published in this process only, so an alert goes once.
        if service.cluster is not None and message.sender is service.cluster:
            return
        try:
            value = json.loads(message.payload)  # any protocol may publish on the topic
        except ValueError:
            return
        celsius = _celsius(value)
        if celsius is not None and celsius > 30:
            subble.publish("alerts", {"room": value.get("room"), "celsius": celsius},
                           source="app")

    service.hub.subscribe_callback("readings", reading)


def _celsius(reading):
    """A reading's degrees, or None if it has none."""
    if not isinstance(reading, dict):
        return None
    celsius = reading.get("celsius")
    return celsius if isinstance(celsius, int | float) and not isinstance(celsius, bool) else None


# -- the demonstration: `python examples/app.py` --------------------------------------------------


def _serve():
    """`wireproto serve --app app:setup --workers 2` in this directory, once ready: the process
    and its listeners' addresses by protocol."""
    import os
    import re
    import subprocess
    import sys

    broker = subprocess.Popen(
        [sys.executable, "-m", "wireproto", "serve", "--app", "app:setup", "--workers", "2",
         "--listen", "ubre+ws@tcp:0", "--listen", "nydus+engineio@tcp:0",
         "--listen", "subble+ws@tcp:0"],
        cwd=os.path.dirname(os.path.abspath(__file__)), stdout=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    addresses = {}
    for line in broker.stdout:
        found = re.match(r"wireproto: (\w+) over \S+ on (\S+)", line)
        if found:
            addresses[found.group(1)] = found.group(2)
        elif re.match(r"wireproto: (\d+) workers", line):
            print("ready:", line.split()[1], "workers")
        elif line.startswith("wireproto: ready"):
            return broker, addresses
    raise SystemExit(f"wireproto serve ended with status {broker.wait()}")


async def _until_both_answer(call):
    """`call()` from new connections until two processes have answered: its last answer."""
    nodes = set()
    for _ in range(100):
        answer = await call()
        nodes.add(answer.pop("node"))
        if len(nodes) == 2:
            return answer
    raise RuntimeError(f"only {nodes} answered")


async def _demonstrate(reactor, addresses):
    from twisted.internet import task

    from wireproto.protocols.nydus import client as nydus_client
    from wireproto.protocols.subble import client as subble_client
    from wireproto.protocols.subble.client import EventRefused
    from wireproto.protocols.ubre.client import connect as ubre_connect

    async def add():
        client = await ubre_connect(reactor, addresses["ubre"])
        try:
            return await client.request("add", [1, 2], timeout=10)
        finally:
            await client.close()

    answer = await _until_both_answer(add)
    print(f"ubre add [1, 2] -> {answer['sum']}, answered by both workers")

    async def join():
        client = await nydus_client.connect(reactor, addresses["nydus"].removesuffix("/engine.io/"))
        try:
            return await client.invoke("/rooms/lobby/join", timeout=10)
        finally:
            await client.close()

    answer = await _until_both_answer(join)
    print(f"nydus /rooms/lobby/join -> {answer}, answered by both workers")

    alerts = []
    watcher = await subble_client.connect(reactor, addresses["subble"], subscribe=["alerts"],
                                          on_event=alerts.append)
    sensor = await subble_client.connect(reactor, addresses["subble"], produce=["readings"])
    # The watcher's subscription reaches the other worker through NATS soon after it is made:
    # a reading every 0.2 s until an alert comes.
    for _ in range(50):
        await sensor.produce("readings", {"room": "kitchen", "celsius": 35}, timeout=10)
        await task.deferLater(reactor, 0.2)
        if alerts:
            break
    alert = alerts[0]
    print(f"subble alert from {alert.source}: {alert.payload}")
    try:
        await sensor.produce("readings", {"room": "hall", "celsius": "hot"}, timeout=10)
    except EventRefused as refused:
        print("subble refused a reading:", refused.message)
    await watcher.close()
    await sensor.close()


if __name__ == "__main__":
    import signal

    from twisted.internet import defer, task

    broker, addresses = _serve()
    try:
        task.react(lambda reactor: defer.ensureDeferred(_demonstrate(reactor, addresses)))
    except SystemExit as done:
        if done.code:
            raise
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)
    print("stopped")
