"""Twisted endpoint plugins: the ``serial:`` and ``replay:`` clients and the ``mtls:`` server
endpoint strings.

The logic lives in wireproto.transports.serial, wireproto.capture.replay and
wireproto.transports.identity.

No ``__init__.py`` here or in ``twisted/``: Twisted finds this file through its plugin path.
"""

from wireproto.capture.replay import ReplayEndpointParser
from wireproto.transports.identity import MutualTLSServerParser
from wireproto.transports.serial import SerialEndpointParser

serialEndpointParser = SerialEndpointParser()
mutualTLSServerParser = MutualTLSServerParser()
replayEndpointParser = ReplayEndpointParser()
