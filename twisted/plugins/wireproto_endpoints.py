"""Twisted endpoint plugins: the ``serial:`` client and ``mtls:`` server endpoint strings.

The logic lives in wireproto.transports.serial and wireproto.transports.identity.

No ``__init__.py`` here or in ``twisted/``: Twisted finds this file through its plugin path.
"""

from wireproto.transports.identity import MutualTLSServerParser
from wireproto.transports.serial import SerialEndpointParser

serialEndpointParser = SerialEndpointParser()
mutualTLSServerParser = MutualTLSServerParser()
