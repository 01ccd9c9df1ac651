"""Sans-IO codecs, one module per spec.

Each module turns bytes or text into frozen message dataclasses with `decode(data)` and back with
`encode(message)`. None of them imports Twisted or touches sockets or clocks, and on bad input
`decode` raises only `wireproto.errors.ProtocolError`.
"""
