"""The private nats-server of `wireproto serve --workers N`, kept running by its supervisor.

It is started when the config names no `[cluster] url`, in a directory of its own (0700) with
a fresh NKey whose seed the workers sign with. From then on it is watched, and started again
when it ends or stops answering: on the same port, with the same directory (JetStream's wills
and last values) and the same key, so the workers, whose NATS client tries again at least
every 2 s, simply reconnect. The pause before each start again grows while it keeps ending
quickly (`RestartPause`); a start that fails (its port taken by another program, say) is
logged with what nats-server said, and tried again after that pause, for as long as the
supervisor runs: the workers keep serving their own clients meanwhile, and an exit would close
every connection without making the port free.

How it is watched, all from the reactor, never blocking it:

- **Ended.** The server is a `subprocess.Popen` child, polled every `WATCH_INTERVAL` (a
  waitpid that does not wait). Twisted's spawnProcess would say at once that it ended, but it
  can neither start the child in a session of its own (so a terminal's Ctrl-C reaches the
  workers, which need NATS to send their wills, and not the server) nor give it the
  parent-death signal, both of which Popen does before the exec; a quarter of a second is
  small beside the workers' reconnect pause.
- **Hung.** A NATS connection of the supervisor's own, signed with the workers' key, sends a
  PING every `CHECK_INTERVAL`. A server that has answered none for `HUNG_AFTER` seconds
  (stopped by SIGSTOP, or stuck) is killed and started again. No HTTP monitoring port is
  opened: any local user could read it. Seconds in which the supervisor itself did not run
  (it was paused, or starved of CPU) are not counted against the server.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.supervisor.natsserver import (
    NatsServer,
    describe_exit,
    new_user_nkey,
    write_private,
)
from wireproto.supervisor.restarts import RestartPause

__all__ = [
    "PRIVATE_NATS_PREFIX",
    "WATCH_INTERVAL",
    "CHECK_INTERVAL",
    "HUNG_AFTER",
    "START_TIMEOUT",
    "PrivateNats",
    "remove_abandoned_directories",
]

log = Logger(namespace="wireproto.cluster")

# The private nats-server's directory: its config, the workers' key and JetStream's data.
PRIVATE_NATS_PREFIX = "wireproto-nats-"
# How often the process is polled; how often it is sent a PING; how long it may leave PINGs
# unanswered before it is killed; how long a start may take.
WATCH_INTERVAL = 0.25
CHECK_INTERVAL = 1.0
HUNG_AFTER = 5.0
START_TIMEOUT = 20.0


def remove_abandoned_directories(parent: str | None = None,
                                 prefix: str = PRIVATE_NATS_PREFIX) -> None:
    """Remove the private nats-server directories (or others named with `prefix`) of this
    user's supervisors that are gone (one killed outright cannot remove its own). A directory
    is named after its supervisor's pid; one whose pid is alive, even if reused by another
    process, is left alone."""
    parent = parent or tempfile.gettempdir()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if not (entry.name.startswith(prefix) and pid.isdigit()):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "it said nothing"


class PrivateNats:
    """One supervisor's private nats-server: `start()` it once, `stop_watching()` when the
    supervisor begins to stop, and `stop()` when the workers are gone."""

    def __init__(self, reactor: IReactorTime) -> None:
        """`reactor` also runs the supervisor's NATS connection (IReactorTCP)."""
        self.reactor = reactor
        self.server: NatsServer | None = None
        # The file of the NKey seed the workers sign with.
        self.seed_file = ""
        self.url = ""
        # How many times it was started again (or tried to be).
        self.restarts = 0
        # "starting", "running", "waiting" (to start again) or "stopped".
        self.state = "stopped"
        self._launched = 0.0
        self._answered = 0.0
        self._pinged = 0.0
        self._pinging = False
        self._ticked = 0.0
        self._pause = RestartPause()
        self._again: IDelayedCall | None = None
        self._watch = LoopingCall(self._tick)
        self._watch.clock = reactor
        self._first: defer.Deferred[str] | None = None
        self._checker: NatsClient | None = None

    # -- starting ---------------------------------------------------------------------------------

    def start(self) -> defer.Deferred[str]:
        """Make its directory and key, and start it: fires with its URL once it accepts clients;
        fails, with its directory removed, if it cannot start (then it is not tried again)."""
        remove_abandoned_directories()
        # mkdtemp's directory is this user's alone (0700).
        directory = tempfile.mkdtemp(prefix=f"{PRIVATE_NATS_PREFIX}{os.getpid()}-")
        seed, public_key = new_user_nkey()
        self.seed_file = os.path.join(directory, "worker.nk")
        write_private(self.seed_file, seed)
        self.server = NatsServer(directory=directory, user_nkey=public_key,
                                 extra_config="max_payload: 8MB")
        self._first = defer.Deferred()
        first = self._first
        try:
            self._launch()
        except Exception as error:
            self._fail_first(error)
            return first
        self._ticked = self.reactor.seconds()
        self._watch.start(WATCH_INTERVAL, now=False)
        return first

    def _launch(self) -> None:
        assert self.server is not None
        self.server.launch()
        self.state = "starting"
        self._launched = self.reactor.seconds()

    def _fail_first(self, error: Exception) -> None:
        first, self._first = self._first, None
        self.stop()
        if first is not None:
            first.errback(error)

    # -- watching ---------------------------------------------------------------------------------

    def _tick(self) -> None:
        try:
            self._watch_once()
        except Exception:  # an error of ours must not end the watching
            log.failure("watching the private nats-server", event="cluster_private_nats_error")

    def _watch_once(self) -> None:
        now = self.reactor.seconds()
        if now - self._ticked > WATCH_INTERVAL + 2.0:
            # The supervisor itself did not run: the server's silence meanwhile is not its own.
            self._answered = max(self._answered, now)
        self._ticked = now
        server = self.server
        if self.state not in ("starting", "running") or server is None \
                or server.process is None:
            return
        returncode = server.process.poll()
        if returncode is not None:
            self._ended(server, returncode, now)
        elif self.state == "starting":
            if server.started():
                self._running(server, now)
            elif now - self._launched > START_TIMEOUT:
                if self._first is not None:
                    self._fail_first(RuntimeError(
                        f"nats-server did not start within {START_TIMEOUT:.0f} s"))
                    return
                log.error("the private nats-server (pid {pid}) did not start within "
                          "{timeout:.0f} s; killing it", event="cluster_private_nats_hung",
                          pid=server.process.pid, timeout=START_TIMEOUT)
                server.process.kill()
        else:
            self._check(server, now)

    def _running(self, server: NatsServer, now: float) -> None:
        self.state = "running"
        self._answered = now
        self.url = server.url
        first, self._first = self._first, None
        if first is not None:
            self._checker = NatsClient(self.reactor, NatsOptions(
                servers=(self.url,), name="wireproto-supervisor", nkey_seed_file=self.seed_file,
                # The supervisor's own PINGs judge the server; the client's would only close.
                ping_interval=3600.0))
            self._checker.start()
            first.callback(self.url)
        else:
            assert server.process is not None
            log.info("the private nats-server is running again on {url} (pid {pid})",
                     event="cluster_private_nats_restarted", url=self.url,
                     pid=server.process.pid)

    def _ended(self, server: NatsServer, returncode: int, now: float) -> None:
        assert server.process is not None
        pid, lived, starting = server.process.pid, now - self._launched, self.state == "starting"
        if self._first is not None:
            self._fail_first(RuntimeError(f"nats-server {describe_exit(returncode)}: "
                                          f"{server.output()[-2000:]}"))
            return
        pause = self._pause.after(lived)
        if starting:
            log.error("the private nats-server could not start again on {url}: it "
                      "{how}, saying {said!r}; trying again in {pause:.1f} s",
                      event="cluster_private_nats_failed", url=self.url,
                      how=describe_exit(returncode), said=_last_line(server.output()),
                      pause=pause)
        else:
            log.warn("the private nats-server (pid {pid}) {how} after {lived:.1f} s; starting "
                     "it again on {url} in {pause:.1f} s", event="cluster_private_nats_ended",
                     pid=pid, how=describe_exit(returncode), lived=lived, url=self.url,
                     pause=pause)
        self.state = "waiting"
        self._again = self.reactor.callLater(pause, self._start_again)

    def _start_again(self) -> None:
        self._again = None
        if self.state != "waiting":
            return
        self.restarts += 1
        try:
            self._launch()
        except Exception as error:  # its binary gone, the directory unwritable...
            pause = self._pause.after(0.0)
            log.error("the private nats-server could not start again: {error}; trying again "
                      "in {pause:.1f} s", event="cluster_private_nats_failed", error=str(error),
                      pause=pause)
            self._again = self.reactor.callLater(pause, self._start_again)

    def _check(self, server: NatsServer, now: float) -> None:
        """PING the server through the supervisor's own connection; kill it once it has
        answered none for HUNG_AFTER seconds."""
        assert server.process is not None
        checker = self._checker
        if now - self._answered > HUNG_AFTER:
            log.error("the private nats-server (pid {pid}) has answered no PING for "
                      "{silent:.1f} s; killing it to start it again",
                      event="cluster_private_nats_hung", pid=server.process.pid,
                      silent=now - self._answered)
            server.process.kill()  # SIGKILL ends a stopped process too
            self._answered = now
            return
        if checker is None or not checker.connected or self._pinging \
                or now - self._pinged < CHECK_INTERVAL:
            return
        self._pinging, self._pinged = True, now

        def answered(_: object) -> None:
            self._answered = self.reactor.seconds()

        def done(_: object) -> None:
            self._pinging = False

        checker.flush().addCallbacks(answered, lambda _: None).addBoth(done)

    # -- stopping ---------------------------------------------------------------------------------

    def stop_watching(self) -> None:
        """Never start it again, nor kill it: the supervisor is stopping. A server that is
        running, or starting, is left to `stop()`."""
        self.state = "stopped"
        if self._watch.running:
            self._watch.stop()
        if self._again is not None and self._again.active():
            self._again.cancel()
        self._again = None
        checker, self._checker = self._checker, None
        if checker is not None:
            checker.stop()

    def stop(self) -> None:
        """Stop watching, stop the server (waiting for it to end) and remove its directory."""
        self.stop_watching()
        server, self.server = self.server, None
        if server is not None:
            server.stop()
            if server.directory:
                shutil.rmtree(server.directory, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        """The server process's pid, while there is one."""
        server = self.server
        if server is None or server.process is None or server.process.poll() is not None:
            return None
        return server.process.pid

