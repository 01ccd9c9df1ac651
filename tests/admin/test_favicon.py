"""`/favicon.ico`: the icon a browser asks every site for, served from the package's own file
on every HTTP listener's port (no more 404 in the page's console), kept a day by the browser."""

from __future__ import annotations

import struct
from importlib import resources

import pytest_twisted

from tests.admin.http import base_of, http
from tests.brokers import LOCAL, Broker
from wireproto.admin import AdminSettings


def package_icon() -> bytes:
    return resources.files("wireproto.admin").joinpath("static", "ui", "favicon.ico").read_bytes()


def test_the_package_icon_is_an_icon() -> None:
    icon = package_icon()
    reserved, kind, count = struct.unpack_from("<HHH", icon)
    assert (reserved, kind) == (0, 1) and count >= 1  # an ICO file's header
    for index in range(count):
        width, height, _, _, _, _, size, offset = struct.unpack_from("<BBBBHHII", icon,
                                                                     6 + 16 * index)
        assert (width, height) in ((16, 16), (32, 32))
        assert icon[offset:offset + 8] == b"\x89PNG\r\n\x1a\n"  # each image a PNG
        assert offset + size <= len(icon)
    assert len(icon) < 4096


@pytest_twisted.ensureDeferred
async def test_every_http_port_serves_the_icon(broker: Broker) -> None:
    # Three ports (an endpoint of its own each); on the third a listener at "/", so no page
    # there, but the icon.
    service, bound = await broker.start(
        f"websmq+ws@tcp:0:{LOCAL}", f"nydus+engineio@tcp:0:backlog=49:{LOCAL}",
        f"websmq+ws/@tcp:0:backlog=48:{LOCAL}")
    bases = {base_of(entry.address) for entry in bound}
    assert len(bases) == 3
    for base in bases:
        answer = await http(base, "/favicon.ico")
        assert answer.status == 200, base
        assert answer.header("content-type") == "image/x-icon"
        assert answer.header("x-content-type-options") == "nosniff"
        assert answer.header("cache-control") == "public, max-age=86400"
        assert answer.body == package_icon()
        head = await http(base, "/favicon.ico", method="HEAD")
        assert head.status == 200 and head.body == b""
        assert (await http(base, "/favicon.ico/x")).status == 404
    # The page itself is still asked for each time.
    page_base = base_of(bound[0].address)
    assert (await http(page_base, "/")).header("cache-control") == "no-cache"


@pytest_twisted.ensureDeferred
async def test_no_icon_with_admin_disabled(broker: Broker) -> None:
    service, bound = await broker.start(f"websmq+ws@tcp:0:{LOCAL}",
                                        admin=AdminSettings(enabled=False))
    assert (await http(base_of(bound[0].address), "/favicon.ico")).status == 404
