"""wireproto: small message protocols (UBRE, WEBSMQ, SubbleSocket, nydus, Phyllo) on Twisted."""

__version__ = "0.1.0.dev0"
