# examples/wireproto.tac: run with `twistd -ny examples/wireproto.tac`
from twisted.application.internet import TimerService
from twisted.application.service import Application

from wireproto.config import build_config
from wireproto.service import make_service

application = Application("my-app")
# Your own services, as before (this one stands for them).
TimerService(3600, lambda: None).setServiceParent(application)

# The broker on its built-in defaults (or load_config("wireproto.toml")), with the handlers
# that docs/tools.md calls: a broker has none of its own.
broker = make_service(build_config())
broker.server("ubre").handle("add", lambda numbers, peer: sum(numbers))
broker.server("nydus").register_route(
    "/rooms/:room/join", lambda call: {"joined": call.params["room"]}
)
broker.setServiceParent(application)
