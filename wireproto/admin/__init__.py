"""The broker's face in a browser (docs/browser.md): a status page at ``/``, the ES-module
clients for WEBSMQ and UBRE at ``/js/``, the admin JSON API at ``/api/``, and the ``$SYS``
topics.

`AdminConsole` is one service's: the service mounts its `routes()` on every HTTP listener's port
and starts and stops it with itself. The modules: `settings` (the [admin] table), `gate` (who
may use the API, and `refusals`, how its refused logins are logged), `api`, `listing` (the
API's lists a page at a time), `tap` (the live view of a pattern), `rates` (publishes per
second by topic), `history` (the broker's figures, second by second), `payloads` (a payload as
the page shows it), `systopics` and `static_files`.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.resource import IResource

from wireproto.admin.api import ADMIN_QUESTION, AdminApi
from wireproto.admin.gate import AdminGate
from wireproto.admin.history import History
from wireproto.admin.rates import TopicRates
from wireproto.admin.refusals import RefusedLogins
from wireproto.admin.settings import AdminSettings
from wireproto.admin.static_files import StaticFiles
from wireproto.admin.systopics import SysTopics
from wireproto.broker import BrokerView

__all__ = ["AdminConsole", "AdminSettings", "PAGE_PATHS"]

log = Logger(namespace="wireproto.admin")

# Where the page, its own files, the clients and the API are, on every HTTP listener's port.
PAGE_PATHS = ("/", "/ui", "/js", "/api", "/favicon.ico")
PAGE_FILES = ("page.js", "page.css", "api.js", "format.js", "table.js", "charts.js", "tap.js",
              "forms.js")
# The icon a browser asks every site for, kept a day.
ICON = "favicon.ico"
ICON_MAX_AGE = 86_400
CLIENT_FILES = ("websmq.js", "ubre.js", "socket.js")


class AdminConsole:
    """One service's page, API and $SYS topics."""

    def __init__(self, service: BrokerView, settings: AdminSettings,
                 reactor: IReactorTime) -> None:
        self.service = service
        self.settings = settings
        hub = service.hub
        hub.count_topics(settings.max_counted_topics)
        self.rates = TopicRates(hub, reactor)
        self.history = History(hub, reactor)
        self.logins = RefusedLogins(reactor)
        gate = AdminGate(settings.allow, service.auth, service.config.websocket.allowed_origins,
                         self.logins)
        self.api = AdminApi(service, gate, self.rates, settings.max_taps, history=self.history)
        self.page = StaticFiles("ui", ("index.html",), index="index.html")
        self.page_files = StaticFiles("ui", PAGE_FILES)
        self.icon = StaticFiles("ui", (ICON,), index=ICON, max_age=ICON_MAX_AGE)
        # Files without secrets, fetched without credentials: any page may import them.
        self.clients = StaticFiles("js", CLIENT_FILES, any_origin=True)
        group = service.cluster
        if group is not None:
            group.answer_others(ADMIN_QUESTION, self.api.answer_question)
        self.sys_topics = SysTopics(service, settings.sys_interval,
                                    None if group is None else group.node,
                                    reactor) if settings.sys_interval else None

    def routes(self, taken: Mapping[str, IResource]) -> dict[str, IResource]:
        """The resources by path, but ``/`` and the icon where a listener is there."""
        routes: dict[str, IResource] = {
            "/ui": self.page_files, "/js": self.clients, "/api": self.api}
        if "/" not in taken:
            routes["/"] = self.page
        if "/" + ICON not in taken:
            routes["/" + ICON] = self.icon
        return routes

    def start(self) -> None:
        self.rates.start()
        self.history.start()
        if self.sys_topics is not None:
            self.sys_topics.start()

    def stop(self) -> None:
        self.rates.stop()
        self.history.stop()
        self.logins.stop()
        if self.sys_topics is not None:
            self.sys_topics.stop()
        self.api.close()
