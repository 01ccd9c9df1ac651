"""The SubbleSocket 1.0.0 client conformance kit: its catalogue is `kit`, cases in the order
they run (docs/conformance.md, "SubbleSocket clients: the driver and results"). The kit plays a
host: it answers the client's handshake, sends it events and judges what it produces, always
reading with wireproto's codec as docs/subblesocket.md reads the spec. What a client must do to
be judged (the driver contract) is in common.py: subscribe to conformance/in, echo every event
on conformance/out, report each event error on conformance/error."""

from __future__ import annotations

from importlib import import_module

from wireproto.conformance.subble.client.common import kit

# Each module adds its cases to `kit` as it is imported, in the order they run.
for _cases in ("sends", "receives", "reconnect", "refusal"):
    import_module(f"{__name__}.{_cases}")

__all__ = ["kit"]
