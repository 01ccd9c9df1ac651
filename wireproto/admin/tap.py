"""A tap: the messages on every topic a pattern matches, as they pass, streamed to one admin HTTP
request as newline-delimited JSON: each with its time and its payload as it was sent, and
decoded where it is JSON or msgpack (`describe_payload`). A line is at most about 4 x
SHOWN_PAYLOAD_BYTES and its topic, whatever the payload.

A tap is a view, not a subscriber with a queue: while the admin's connection cannot take more
(Twisted pauses the tap, registered as its producer), messages are skipped and counted, and the
count is sent as ``{"skipped": N}`` when it drains. So a slow browser holds at most what the
socket's buffer holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from wireproto.admin.payloads import describe_payload
from wireproto.hub import Hub, HubMessage, LocalSubscriber

__all__ = ["Tap", "SHOWN_PAYLOAD_BYTES"]

# Of a payload longer than this, its start is shown.
SHOWN_PAYLOAD_BYTES = 16_384


@implementer(IPushProducer)
class Tap:
    def __init__(self, hub: Hub, pattern: str, request: Any,
                 stopped: Callable[[Tap], object]) -> None:
        self.pattern = pattern
        self.request = request
        self.skipped = 0
        self.shown = 0
        self._paused = False
        self._stopped = stopped
        self._subscription: LocalSubscriber | None = hub.subscribe_callback(pattern, self._message)
        request.setHeader(b"content-type", b"application/x-ndjson")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.registerProducer(self, True)
        request.notifyFinish().addBoth(lambda _: self.stop())
        self._write({"tap": pattern})

    def _write(self, value: Any) -> None:
        self.request.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS) + b"\n")

    def _message(self, message: HubMessage) -> None:
        if self._paused:
            self.skipped += 1
            return
        self.shown += 1
        payload = message.payload
        # As it was sent (a JSON number as written, control characters escaped by JSON
        # alone), and decoded for scripts.
        self._write({"topic": message.topic, "protocol": message.protocol or None,
                     "will": message.will, "time": round(time.time(), 3),
                     **describe_payload(payload, SHOWN_PAYLOAD_BYTES)})

    def stop(self) -> None:
        """Stop following the pattern (the request is finished or gone)."""
        subscription, self._subscription = self._subscription, None
        if subscription is None:
            return
        subscription.cancel()
        self._stopped(self)
        request = self.request
        if not request.finished and not request._disconnected:
            request.unregisterProducer()
            request.finish()

    # -- IPushProducer --------------------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self.skipped and self._subscription is not None:
            skipped, self.skipped = self.skipped, 0
            self._write({"skipped": skipped})

    def stopProducing(self) -> None:
        self.stop()
