"""Serial devices by what they are: their USB identity, the ports that have it, and the watch
for boards plugged in and pulled out (docs/phyllo.md, "Boards by identity").

- `ports`: `PortInfo` and `system_ports()`, what pyserial's list_ports knows of each port;
- `matching`: `PortMatch` (``serial:vid=2341:pid=0043``) and `resolve`, its clear errors;
- `listing`: `PortListing`, which runs a lister off the reactor's thread, one at a time;
- `watch`: `PortWatcher`, told of changes by udev or by polling;
- `standin`: pty pairs that stand in for boards in tests and benchmarks.
"""

from wireproto.devices.listing import PortListing, PortsNotListed
from wireproto.devices.matching import (
    MATCH_KEYS,
    NoMatchingPort,
    PortMatch,
    SeveralMatchingPorts,
    board_name,
    resolve,
)
from wireproto.devices.ports import PortInfo, PortLister, system_ports
from wireproto.devices.watch import PollingWatcher, PortWatcher, UdevWatcher, system_watcher

__all__ = [
    "MATCH_KEYS",
    "NoMatchingPort",
    "PollingWatcher",
    "PortInfo",
    "PortLister",
    "PortListing",
    "PortMatch",
    "PortWatcher",
    "PortsNotListed",
    "SeveralMatchingPorts",
    "UdevWatcher",
    "board_name",
    "resolve",
    "system_ports",
    "system_watcher",
]
