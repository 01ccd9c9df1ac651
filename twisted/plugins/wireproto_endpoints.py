"""Twisted endpoint plugin: the ``serial:`` client endpoint string.

The logic lives in wireproto.transports.serial.

No ``__init__.py`` here or in ``twisted/``: Twisted finds this file through its plugin path.
"""

from wireproto.transports.serial import SerialEndpointParser

serialEndpointParser = SerialEndpointParser()
