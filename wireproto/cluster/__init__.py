"""Several broker processes as one: the hub's topics, calls and wills shared over NATS
(docs/cluster.md).

`subjects` maps hub topics onto NATS subjects; `natsproto` and `client` speak NATS; `link` joins
a hub to the others.
"""
