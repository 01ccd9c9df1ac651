"""A broker process's cluster calls in its capture files (docs/pipeline.md, "A fleet").

With capture on, each process records the calls it makes to other processes and the calls it
answers for them as the messages of one connection of protocol ``cluster`` over transport
``nats``: each record is a NATS message as it crossed, msgpack ``[subject, reply, headers,
payload]``. A call's reply subject is its NATS inbox, unique in the cluster, so the caller's
record of a call and the answering process's record of the same call carry the same id, and
``wireproto analyze`` pairs them across brokers (`wireproto.cluster.analysis` reads them).
A call's acknowledgement (which process took it) is not recorded, so the first reply recorded
for a call is its answer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgpack

from wireproto.capture.format import encode_batch

if TYPE_CHECKING:
    from wireproto.capture.wrapper import BrokerCapture

__all__ = ["CallCapture", "encode_nats_message", "NO_RESPONDERS"]

IN, OUT = 0, 1
# What NATS sends a request's inbox when no one subscribes to its subject.
NO_RESPONDERS = b"NATS/1.0 503\r\n\r\n"


def encode_nats_message(subject: str, reply: str | None, headers: bytes | None,
                        payload: bytes) -> bytes:
    return msgpack.packb([subject, reply, headers, payload])


class CallCapture:
    """Records one process's cluster calls to `capture` as one connection to `server`."""

    def __init__(self, capture: BrokerCapture, server: str) -> None:
        self.capture = capture
        self.server = server
        self.connection_id: int | None = None

    def start(self) -> None:
        if self.connection_id is None:
            self.connection_id = self.capture.next_id()
            self.capture.opened(self.connection_id, self.server, "cluster", "nats")

    def stop(self) -> None:
        if self.connection_id is not None:
            self.capture.closed(self.connection_id, "stopped")
            self.connection_id = None

    def sent(self, subject: str, reply: str | None, headers: bytes | None,
             payload: bytes) -> None:
        self._record(OUT, subject, reply, headers, payload)

    def received(self, subject: str, reply: str | None, headers: bytes | None,
                 payload: bytes) -> None:
        self._record(IN, subject, reply, headers, payload)

    def _record(self, direction: int, subject: str, reply: str | None, headers: bytes | None,
                payload: bytes) -> None:
        if self.connection_id is not None:
            # A batch record of one message, as the capture records every message.
            self.capture.batch(self.connection_id, direction, encode_batch(
                [encode_nats_message(subject, reply, headers, payload)]), True, time.time_ns())
