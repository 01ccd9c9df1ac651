"""wireproto in an asyncio program: Twisted's asyncio reactor, and Deferreds awaited as futures.

With `asyncioreactor` installed, Twisted and asyncio share one event loop, so asyncio code (here
``asyncio.sleep`` and ``asyncio.wait_for``) and wireproto run side by side. A Deferred becomes an
asyncio future with ``d.asFuture(loop)``; a coroutine becomes a Deferred with
``Deferred.fromFuture(asyncio.ensure_future(coroutine))``. Twisted still runs the loop
(``task.react``), which starts what Twisted needs, such as the thread pool that resolves
addresses.

Run it with ``python examples/embed_asyncio.py``. It prints:

    listening: ubre over ws
    add -> 3
    asyncio.wait_for -> news {'title': 'hello'}
    stopped
"""

import asyncio

from twisted.internet import asyncioreactor

asyncioreactor.install()  # before anything imports twisted.internet.reactor

from twisted.internet import defer, task  # noqa: E402

from wireproto.config import build_config  # noqa: E402
from wireproto.protocols.ubre.client import UbreClient  # noqa: E402
from wireproto.service import make_service  # noqa: E402


async def main(reactor):
    """asyncio code: it awaits futures, so each Deferred goes through asFuture(loop)."""
    loop = asyncio.get_running_loop()
    service = make_service(build_config(listen=["ubre+ws@tcp:0"]), reactor)
    ubre = service.server("ubre")
    ubre.handle("add", lambda numbers, peer: sum(numbers))
    service.startService()
    [bound] = await service.when_listening().asFuture(loop)
    print("listening:", bound.listener.describe())

    client = await UbreClient(reactor, bound.address, request_timeout=5).connect().asFuture(loop)
    got = loop.create_future()
    client.subscribe("news", lambda message: got.done() or got.set_result(message))
    print("add ->", await client.request("add", [1, 2]).asFuture(loop))

    await asyncio.sleep(0)  # asyncio's own awaitables work as usual
    ubre.publish("news", {"title": "hello"})  # host code publishes into the hub
    message = await asyncio.wait_for(got, timeout=5)
    print("asyncio.wait_for ->", message.topic, message.body)

    await client.close().asFuture(loop)
    await service.stopService().asFuture(loop)
    print("stopped")


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromFuture(asyncio.ensure_future(main(reactor))))
