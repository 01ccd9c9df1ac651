"""Several broker processes as one: the hub's topics, calls and wills shared over NATS
(docs/cluster.md).

`subjects` maps hub topics onto NATS subjects; `client` speaks NATS (its bytes are
`wireproto.codecs.nats`); `link` joins a hub to the others (its Wp header is
`wireproto.codecs.wpheader`).
"""
