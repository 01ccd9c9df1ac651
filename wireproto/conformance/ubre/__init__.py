"""The UBRE conformance kit: `kit`, the catalogue of cases that judge a UBRE server
(docs/conformance.md; the spec as docs/ubre.md describes it, and what wireproto decided).

The cases are in this package's modules, registered in the order they run: publish and
subscribe, requests, limits and closes, malformed input."""

from wireproto.conformance.ubre import pubsub, requests, limits, malformed  # noqa: F401, I001
from wireproto.conformance.ubre.common import kit

__all__ = ["kit"]
