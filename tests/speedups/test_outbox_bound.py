"""The slow-consumer bound holds inside a read: one read of small requests must not make the
broker hold more for a peer than Twisted's buffer, one read and the session's queue limit. A
SUB then UNSUB of a kept topic sends its last value again each time; inside a read's batch the
session's `writes_now` stays true (Twisted cannot pause it before the outbox writes), so the
outbox writes once it holds more than 64 KiB, and the rest goes to the session's queue, under
its limit and overflow policy. Without that, 200 pairs (a 4 KB read) held 50 MB for the peer."""

from __future__ import annotations

import socket
import struct

import pytest
import pytest_twisted

from tests.brokers import LOCAL
from tests.support import eventually, sleep
from wireproto.codecs import websmq
from wireproto.codecs.websmq import Publish, Subscribe, Unsubscribe
from wireproto.config import HubSettings

pytestmark = pytest.mark.usefixtures("fast_path")

QUEUE = 64 * 1024
RETAINED = 256 * 1024
PAIRS = 200  # 200 SUB/UNSUB pairs: one read of about 4 KB
TWISTED_BUFFER = 65536
ONE_READ = 65536 + 1024


def length32(*messages: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def buffered(session) -> int:
    tcp = session.transport.transport
    return len(tcp.dataBuffer) - tcp.offset + tcp._tempDataLen


@pytest_twisted.ensureDeferred
async def test_one_read_of_resubscribes_to_a_retained_topic_stays_within_the_queue_limit(
        broker, net):
    service, bound = await broker.start(f"websmq+length32@tcp:0:{LOCAL}",
                                        hub=HubSettings(queue_bytes=QUEUE, retain=("kept",)))
    port = int(bound[0].address.rsplit(":", 1)[1].split("/")[0])
    publisher = await net.raw_connect(port)
    publisher.transport.write(length32(websmq.encode(Publish("kept", b"r" * RETAINED))))
    await eventually(lambda: service.hub.retained is not None
                     and service.hub.retained.get("kept") is not None)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    attacker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never reads
    attacker.connect(("127.0.0.1", port))
    try:
        attacker.sendall(length32(*[websmq.encode(m) for _ in range(PAIRS)
                                    for m in (Subscribe("kept"), Unsubscribe("kept"))]))
        await sleep(0.5)
        held = max(buffered(s) + s.queued_bytes for s in service.hub.sessions)
        assert held <= TWISTED_BUFFER + ONE_READ + RETAINED + QUEUE, held
    finally:
        attacker.close()
