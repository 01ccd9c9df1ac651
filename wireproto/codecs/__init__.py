"""Sans-IO codecs, one module per spec.

Each module turns bytes or text into frozen message dataclasses with `decode(data)` and back with
`encode(message)`. A codec of a byte stream, where one read may end inside a message or hold
several (NATS, a Phyllo serial line), also names its incremental decoder `Decoder`: its `feed`
returns what the bytes so far complete, and `decode` reads a whole buffer. None of them imports
Twisted or touches sockets or clocks, and on bad input `decode` and `Decoder.feed` raise only
`wireproto.errors.ProtocolError`.
"""
