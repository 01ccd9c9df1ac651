"""Authentication as a broker runs it: the [auth] table, the credentials it loads (a JWT key, a
password file), the access rules, and how each kind of connection gets its principal.

- WebSocket and Engine.IO handshakes carry ``Authorization: Bearer TOKEN``, an ``access_token``
  query parameter (browsers cannot set headers), or HTTP Basic against the password file.
  `Authentication.authenticate_http` checks them before any session exists: a request without
  credentials, or with bad ones, gets 401, and one whose principal may not use the listener 403.
  Password checks (scrypt, slow on purpose) run on a small thread pool of their own, a bounded
  number at a time, taken from each address in turn; an address, or a user from one address,
  that has failed too often is refused at once, unchecked (wireproto.access.logins).
- ``mtls:`` listeners take the principal from the client certificate's subject or SAN
  (wireproto.transports.tls); ``unix:`` listeners from the peer's uid; a listener may also name a
  fixed principal, or make every connection anonymous. Serial lines, attached links and Phyllo
  devices are the principal their config names.

Each principal carries the `Credential` that proved it: the hub closes its connection once a
token or certificate expires (plus `expiry_leeway`), and after a reload `withdrawn` says whether
it still holds under the files as they are now, the ``mtls:`` listeners' CA files included.

`Authentication.load` reads every file at once, so a bad one is found before anything listens,
and `reload` rereads them (SIGHUP), keeping the old ones if any new one is bad. docs/security.md
describes the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.serialization import Encoding
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from wireproto import peerlog
from wireproto.access import ANONYMOUS, AccessRule, Credential, Policy, Principal
from wireproto.access.credentials import CERTIFICATE, PASSWORD, TOKEN
from wireproto.access.logins import FairQueue, LoginThrottle, QueueFull
from wireproto.access.passwords import PasswordFile, PasswordFileError
from wireproto.access.tokens import AuthenticationFailed, TokenVerifier
from wireproto.peerlog import address_key, describe_address
from wireproto.settings import (
    boolean,
    choice,
    integer,
    positive_number,
    seconds_or_never,
    setting,
    strings,
)
from wireproto.transports.credentials import http_credentials, strip_credentials
from wireproto.transports.http import HTTPRefusal, Identify
from wireproto.transports.identity import (
    CERTIFICATE_NAMES,
    ClientAuthorities,
    certificate_name,
    peer_certificates,
    unix_peer_user,
)

if TYPE_CHECKING:
    from twisted.python.threadpool import ThreadPool

__all__ = [
    "AuthSettings",
    "IDENTITIES",
    "Authentication",
    "check_auth_files",
    "default_identity",
    "http_credentials",
    "strip_credentials",
]

log = Logger(namespace="wireproto.auth")

# How a listener's connections get their principal.
IDENTITIES = ("credentials", "certificate", "unix-peer", "anonymous")
DEFAULT_EXPIRY_LEEWAY = 5.0
JWT_ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384",
                  "PS512", "ES256", "ES384", "ES512", "EdDSA")


def _fixed_principal(name: str | None, identity: str | None) -> Principal | None:
    """The one principal of a listener or link that names it, or anonymous by choice."""
    if name is not None:
        return Principal(name)
    if identity == "anonymous":
        return ANONYMOUS
    return None


def _admitted(principal: Principal, allow: tuple[str, ...]) -> bool:
    """Whether a listener's `allow` list names `principal` or one of its roles."""
    if principal.name is not None and principal.name in allow:
        return True
    return any(f"role:{role}" in allow for role in principal.roles)


def default_identity(endpoint: str, *, stream: bool) -> str:
    """How a listener's connections get their principal when it does not say: the client
    certificate on ``mtls:``, the peer's uid on a ``unix:`` stream, credentials in a ws or
    engineio handshake, else anonymous."""
    kind = endpoint.split(":", 1)[0].lower()
    if kind == "mtls":
        return "certificate"
    if not stream:
        return "credentials"
    return "unix-peer" if kind == "unix" else "anonymous"


def _count_or_never(value: Any) -> int:
    if integer(value) < 0:
        raise ValueError(f"expected a count (0: never), got {value}")
    return value


@dataclass(frozen=True)
class AuthSettings:
    """The [auth] table. Its presence turns authentication on: from then on, what no [[acl]]
    rule allows is denied."""

    # Set by the presence of [auth] in a file (or by a caller), never as a key.
    enabled: bool = setting(False, in_config=False)
    # Connections without credentials get in as the anonymous principal (only rules for
    # everyone apply to them); off, they are refused.
    anonymous: bool = setting(False, read=boolean)
    password_file: str = ""
    jwt_algorithms: tuple[str, ...] = setting((), read=strings)
    jwt_secret_file: str = ""
    jwt_public_key_file: str = ""
    jwt_jwks_file: str = ""
    jwt_audience: str = ""
    jwt_issuer: str = ""
    jwt_leeway: float = setting(0.0, read=seconds_or_never)
    # How long past its token's exp or its certificate's notAfter a connection is closed (clock
    # skew); a token's close waits jwt_leeway if that is longer.
    expiry_leeway: float = setting(DEFAULT_EXPIRY_LEEWAY, read=seconds_or_never)
    roles_claim: str = "roles"
    topics_claim: str = "topics"
    certificate_name: str = setting("cn", read=choice(CERTIFICATE_NAMES, "certificate name"))
    # Refusals one connection may earn before it is closed (0: never).
    close_after_denials: int = setting(20, read=_count_or_never)
    # Threads for password checks, and how many checks may wait for one, in all and from one
    # address.
    password_threads: int = 2
    max_pending_password_checks: int = 64
    max_pending_password_checks_per_address: int = 4
    # Wrong passwords one address, and one user from one address, may try (0: any number)
    # before each further try waits: the delay doubles with each failure, up to the max, and a
    # quiet period forgets them.
    failed_logins_per_address: int = setting(20, read=_count_or_never)
    failed_logins_per_user: int = setting(5, read=_count_or_never)
    failed_login_delay: float = setting(1.0, read=positive_number)
    failed_login_max_delay: float = setting(300.0, read=positive_number)
    forget_failed_logins_after: float = setting(3600.0, read=positive_number)

    def __post_init__(self) -> None:
        for algorithm in self.jwt_algorithms:
            if algorithm not in JWT_ALGORITHMS:
                raise ValueError(f"jwt_algorithms: unknown algorithm {algorithm!r}")
        keys = [name for name in ("jwt_secret_file", "jwt_public_key_file", "jwt_jwks_file")
                if getattr(self, name)]
        if len(keys) > 1:
            raise ValueError(f"give one JWT key, not {' and '.join(keys)}")
        if keys and not self.jwt_algorithms:
            raise ValueError(f"{keys[0]} needs jwt_algorithms, e.g. [\"RS256\"]")
        if self.jwt_algorithms and not keys:
            raise ValueError(
                "jwt_algorithms needs a key: jwt_secret_file, jwt_public_key_file or "
                "jwt_jwks_file"
            )
        if self.failed_login_max_delay < self.failed_login_delay:
            raise ValueError(f"failed_login_max_delay ({self.failed_login_max_delay:g}) is "
                             f"below failed_login_delay ({self.failed_login_delay:g})")

    @property
    def takes_tokens(self) -> bool:
        return bool(self.jwt_algorithms)

    @property
    def takes_passwords(self) -> bool:
        return bool(self.password_file)


@dataclass(frozen=True)
class _PasswordCheck:
    """A password waiting for a thread to check it, and who hears the answer."""

    passwords: PasswordFile
    user: str
    password: str
    result: defer.Deferred[bool]


@dataclass(frozen=True)
class _Credentials:
    """What the [auth] files hold, read together."""

    verifier: TokenVerifier | None
    passwords: PasswordFile | None
    policy: Policy


class Authentication:
    """A broker's authentication and access rules, loaded from its [auth] table and [[acl]]
    rules. `policy` is what the hub checks; `authenticate_http` admits HTTP handshakes."""

    def __init__(self, settings: AuthSettings, rules: tuple[AccessRule, ...],
                 reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.settings = settings
        self.rules = rules
        self.reactor = reactor
        self._loaded = self._load(settings, rules)
        self.logins = LoginThrottle(
            per_address=settings.failed_logins_per_address,
            per_user=settings.failed_logins_per_user, delay=settings.failed_login_delay,
            max_delay=settings.failed_login_max_delay,
            forget_after=settings.forget_failed_logins_after,
        )
        self._queue: FairQueue[str, _PasswordCheck] = FairQueue(
            settings.max_pending_password_checks_per_address,
            settings.max_pending_password_checks)
        self._checking = 0
        # The CAs of the mtls: listeners whose certificates name principals, by CA file: a
        # reload rereads them too.
        self._authorities: dict[str, list[ClientAuthorities]] = {}
        self._pool: ThreadPool | None = None
        # Authentications by outcome ("ok" or a refusal's reason), and password checks run
        # (each one scrypt), for /metrics.
        self.outcomes: dict[str, int] = {}
        self.password_checks = 0

    @property
    def policy(self) -> Policy:
        return self._loaded.policy

    @staticmethod
    def _load(settings: AuthSettings, rules: tuple[AccessRule, ...]) -> _Credentials:
        """Everything the files say; ValueError naming the file and the problem."""
        verifier = None
        if settings.takes_tokens:
            jwks_text = _read(settings.jwt_jwks_file, "jwt_jwks_file")
            try:
                jwks = None if jwks_text is None else json.loads(jwks_text)
            except ValueError as error:
                raise ValueError(f"jwt_jwks_file: {settings.jwt_jwks_file} is not JSON: "
                                 f"{error}") from None
            secret = _read(settings.jwt_secret_file, "jwt_secret_file", binary=True)
            public_key = _read(settings.jwt_public_key_file, "jwt_public_key_file",
                               binary=True)
            key_name = ("jwt_secret_file" if secret is not None else "jwt_public_key_file"
                        if public_key is not None else "jwt_jwks_file")
            try:
                verifier = TokenVerifier(
                    algorithms=settings.jwt_algorithms, secret=secret, public_key=public_key,
                    jwks=jwks, audience=settings.jwt_audience or None,
                    issuer=settings.jwt_issuer or None, leeway=settings.jwt_leeway,
                    roles_claim=settings.roles_claim,
                    topics_claim=settings.topics_claim or None,
                )
            except ValueError as error:
                raise ValueError(f"{key_name}: {error}") from None
        passwords = None
        if settings.takes_passwords:
            try:
                passwords = PasswordFile.load(settings.password_file)
            except (OSError, PasswordFileError) as error:
                raise ValueError(f"password_file: {error}") from None
        return _Credentials(verifier, passwords, Policy(rules))

    def reload(self) -> bool:
        """Reread the key and password files and the mtls: listeners' CA files; False, with the
        old ones kept and the reason logged, if one is bad."""
        try:
            loaded = self._load(self.settings, self.rules)
            authorities = {path: group[0].read() for path, group in self._authorities.items()}
        except ValueError as error:
            log.error("auth: reload failed, keeping the old credentials and rules: {error}",
                      event="auth_reload_failed", error=str(error))
            return False
        self._loaded = loaded
        for path, certificates in authorities.items():
            for listener in self._authorities[path]:
                listener.take(certificates)
        return True

    def withdrawn(self, principal: Principal) -> str | None:
        """Why the credential that proved `principal` no longer holds under the files as loaded
        now (after a reload), or None if it still does or nothing that can be withdrawn proved
        it. A password holds while its user's line is the same; a token while the key that
        verified it is still configured; a client certificate while its chain leads to a CA in
        its listener's CA file."""
        credential = principal.credential
        if credential is None:
            return None
        if credential.kind == PASSWORD:
            passwords = self._loaded.passwords
            line = None if passwords is None else passwords.line_stamp(principal.name or "")
            if line is None:
                return "the user is no longer in the password file"
            if line != credential.stamp:
                return "the user's password changed"
        elif credential.kind == TOKEN:
            verifier = self._loaded.verifier
            if verifier is None or credential.stamp not in verifier.key_stamps:
                return "its signing key is no longer configured"
        elif credential.kind == CERTIFICATE and credential.authority is not None:
            group = self._authorities.get(credential.authority)
            if group and not group[0].admits(credential.chain):
                return "its certificate is signed by no CA the listener trusts now"
        return None

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    @property
    def challenge(self) -> str:
        """The WWW-Authenticate value of a 401: the schemes this broker takes."""
        schemes = []
        if self.settings.takes_tokens:
            schemes.append('Bearer realm="wireproto"')
        if self.settings.takes_passwords:
            schemes.append('Basic realm="wireproto", charset="UTF-8"')
        return ", ".join(schemes)

    # -- how a listener's or link's connections get their principal ------------------------------

    def identify_http(self, principal: str | None, identity: str | None,
                      endpoint: str, allow: tuple[str, ...] = (),
                      authorities: ClientAuthorities | None = None) -> Identify:
        """How a ws or engineio listener's handshakes get their principal: `principal` for all
        of them, anonymous, the TLS client certificate, or (the default) their credentials;
        with `allow`, one it does not name (or name a role of) is refused with 403.
        `authorities` are the CAs of an mtls: endpoint, to check its certificates against after
        a reload."""
        identify = self._identify_http(principal, identity, endpoint, authorities)
        if not allow:
            return identify

        def allowed_here(request: Any) -> defer.Deferred[Principal]:
            peer = request.getClientAddress()

            def check(found: Principal) -> Principal:
                if not _admitted(found, allow):
                    self.count("listener")
                    self._log_not_here(peer, found)
                    raise HTTPRefusal(403, "listener", "this principal may not use this "
                                      "listener")
                return found

            return identify(request).addCallback(check)

        return allowed_here

    def _log_not_here(self, peer: Any, principal: Principal) -> None:
        peerlog.warn(log, address_key(peer), "auth: refused {peer}: {principal} may not use "
                     "this listener", event="auth_failed", peer=describe_address(peer),
                     principal=principal.name, reason="listener", status=403)

    def _identify_http(self, principal: str | None, identity: str | None,
                       endpoint: str, authorities: ClientAuthorities | None) -> Identify:
        fixed = _fixed_principal(principal, identity)
        if fixed is not None:
            def as_fixed(request: Any) -> defer.Deferred[Principal]:
                strip_credentials(request)
                return defer.succeed(fixed)

            return as_fixed
        if (identity or default_identity(endpoint, stream=False)) == "certificate":
            def by_certificate(request: Any) -> defer.Deferred[Principal]:
                strip_credentials(request)
                found = self.certificate_principal(request.channel.transport, authorities)
                if found is None:
                    return defer.fail(HTTPRefusal(403, "certificate", "no principal name in "
                                                  "the client certificate"))
                return defer.succeed(found)

            return by_certificate
        return self.authenticate_http

    def identify_stream(self, principal: str | None, identity: str | None,
                        endpoint: str, allow: tuple[str, ...] = (),
                        authorities: ClientAuthorities | None = None,
                        ) -> Callable[[Any], Principal | None]:
        """How a stream listener's or an attached link's connections get their principal, from
        their byte transport (None refuses one, as it does one `allow` does not name)."""
        identify = self._identify_stream(principal, identity, endpoint, authorities)
        if not allow:
            return identify

        def allowed_here(transport: Any) -> Principal | None:
            found = identify(transport)
            if found is None or _admitted(found, allow):
                return found
            self.count("listener")
            self._log_not_here(transport.getPeer(), found)
            return None

        return allowed_here

    def _identify_stream(self, principal: str | None, identity: str | None,
                         endpoint: str, authorities: ClientAuthorities | None,
                         ) -> Callable[[Any], Principal | None]:
        fixed = _fixed_principal(principal, identity)
        if fixed is not None:
            return lambda transport: fixed
        identity = identity or default_identity(endpoint, stream=True)
        if identity == "certificate":
            return lambda transport: self.certificate_principal(transport, authorities)
        if identity == "unix-peer":
            def unix_peer(transport: Any) -> Principal | None:
                name = unix_peer_user(transport)
                return None if name is None else Principal(name)

            return unix_peer
        return lambda transport: ANONYMOUS

    def watch_authorities(self, authorities: ClientAuthorities | None) -> None:
        """Reread the CA file of `authorities` (an mtls: endpoint's) at each reload, for the
        handshakes to come and to check the certificates it admitted."""
        if authorities is not None:
            group = self._authorities.setdefault(authorities.path, [])
            if authorities not in group:
                group.append(authorities)

    def certificate_principal(self, transport: Any,
                              authorities: ClientAuthorities | None = None) -> Principal | None:
        """The principal the TLS peer's certificate names, or None (logged) if it names none. Its
        credential expires with the first certificate of the chain to expire, and a reload
        checks it against `authorities`, the CAs that admitted it."""
        chain = peer_certificates(transport)
        name = certificate_name(chain[0], self.settings.certificate_name) if chain else None
        if name is not None:
            expires = min(certificate.not_valid_after_utc.timestamp() for certificate in chain)
            der = tuple(certificate.public_bytes(Encoding.DER) for certificate in chain)
            return Principal(name, credential=Credential(
                CERTIFICATE, expires=expires, chain=der,
                authority=None if authorities is None else authorities.path))
        self.count("certificate")
        peer = transport.getPeer()
        peerlog.warn(log, address_key(peer), "auth: refused {peer}: its certificate has no "
                     "{which}", event="auth_failed", peer=describe_address(peer),
                     which=self.settings.certificate_name, reason="certificate")
        return None

    # -- HTTP handshakes ------------------------------------------------------------------------

    def authenticate_http(self, request: Any, *,
                          log_refusals: bool = True) -> defer.Deferred[Principal]:
        """The principal of an HTTP handshake, from its credentials (which are then taken out
        of the request); fails with HTTPRefusal. Each outcome is counted and logged, without
        the credentials; a refusal is not logged with `log_refusals` False (the admin API
        logs its own, wireproto.admin.refusals)."""
        peer = request.getClientAddress()
        d = self._authenticate_http(request)

        def ok(principal: Principal) -> Principal:
            self.count("ok")
            log.info("auth: {peer} is {principal}", event="authenticated",
                     peer=describe_address(peer), principal=principal.name)
            return principal

        def refused(failure: Any) -> Any:
            error = failure.value
            if isinstance(error, HTTPRefusal):
                self.count(error.reason)
                if error.status == 401:
                    error.challenge = self.challenge
                if log_refusals:
                    peerlog.warn(log, address_key(peer),
                                 "auth: refused {peer} ({status}): {why}", event="auth_failed",
                                 peer=describe_address(peer), status=error.status,
                                 reason=error.reason, why=str(error))
            return failure

        return d.addCallbacks(ok, refused)

    def _authenticate_http(self, request: Any) -> defer.Deferred[Principal]:
        credentials = http_credentials(request)
        strip_credentials(request)
        try:
            if credentials is None:
                if not self.settings.anonymous:
                    raise HTTPRefusal(401, "missing", "no credentials")
                return defer.succeed(ANONYMOUS)
            scheme, value = credentials
            if scheme == "bearer":
                return defer.succeed(self._token_principal(value))
            if scheme == "basic":
                return self._password_principal(value, address_key(request.getClientAddress()))
            raise HTTPRefusal(401, "scheme", f"unknown authorization scheme {scheme!r}")
        except HTTPRefusal as refusal:
            return defer.fail(refusal)

    def _token_principal(self, token: str) -> Principal:
        verifier = self._loaded.verifier
        if verifier is None:
            raise HTTPRefusal(401, "scheme", "a bearer token, but [auth] takes no tokens")
        try:
            return verifier.principal(token)
        except AuthenticationFailed as failed:
            raise HTTPRefusal(401, failed.reason, str(failed)) from None

    def _password_principal(self, user_password: str,
                            network: str) -> defer.Deferred[Principal]:
        """The user whose password this is, from `network` (as `wireproto.peerlog.address_key`
        counts an address), once a thread has checked it; refused at once if the address or
        the user from it has failed too often, or if too many checks are waiting."""
        passwords = self._loaded.passwords
        if passwords is None:
            raise HTTPRefusal(401, "scheme", "a password, but [auth] has no password_file")
        user, colon, password = user_password.partition(":")
        if not colon or not user:
            raise HTTPRefusal(401, "malformed", "HTTP Basic credentials that are not user:password")
        self._refuse_if_throttled(network, user)
        check = _PasswordCheck(passwords, user, password, defer.Deferred())
        try:
            shed = self._queue.push(network, check)
        except QueueFull as full:
            raise HTTPRefusal(503, "busy", str(full)) from None
        for other in shed:
            other.result.errback(HTTPRefusal(503, "busy", "its place in the queue went to a "
                                             "login from an address with fewer waiting"))
        self._check_passwords()

        def checked(ok: bool) -> Principal:
            if not ok:
                raise HTTPRefusal(401, "bad_password", f"wrong user or password for {user!r}")
            return Principal(user, credential=Credential(PASSWORD,
                                                         stamp=passwords.line_stamp(user)))

        return check.result.addCallback(checked)

    def _refuse_if_throttled(self, network: str, user: str) -> None:
        by = self.logins.refusal(network, user)
        if by is not None:
            whom = "this address" if by == "address" else f"{user!r} from this address"
            raise HTTPRefusal(401, "throttled", f"too many failed logins by {whom}; not "
                              "checked")

    def _check_passwords(self) -> None:
        """Start checking waiting passwords, address by address, while a thread is free. One
        whose address ran out of budget while it waited is refused unchecked."""
        from twisted.internet.threads import deferToThreadPool

        while self._checking < self.settings.password_threads:
            taken = self._queue.pop()
            if taken is None:
                return
            network, check = taken
            try:
                self._refuse_if_throttled(network, check.user)
            except HTTPRefusal as refusal:
                self._queue.done(network)
                check.result.errback(refusal)
                continue
            self._checking += 1
            self.password_checks += 1
            d = deferToThreadPool(self.reactor, self._thread_pool(), check.passwords.check,
                                  check.user, check.password)
            d.addBoth(self._password_checked, network, check)

    def _password_checked(self, result: bool | Failure, network: str,
                          check: _PasswordCheck) -> None:
        """Remember the outcome (before the next check from the address is let through), answer,
        and start the next check."""
        self._checking -= 1
        self._queue.done(network)
        if isinstance(result, Failure):
            check.result.errback(result)
        else:
            if result:
                self.logins.succeeded(network, check.user)
            else:
                self.logins.failed(network, check.user)
            check.result.callback(result)
        self._check_passwords()

    def _thread_pool(self) -> ThreadPool:
        if self._pool is None:
            from twisted.python.threadpool import ThreadPool

            self._pool = ThreadPool(0, self.settings.password_threads, "wireproto-passwords")
            self._pool.start()
            self.reactor.addSystemEventTrigger("during", "shutdown", self.stop)
        return self._pool

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()


def check_auth_files(settings: AuthSettings, rules: tuple[AccessRule, ...]) -> None:
    """ValueError naming the key and the file if an [auth] file cannot be read or used."""
    if settings.enabled:
        Authentication._load(settings, rules)


def _read(path: str, key: str, *, binary: bool = False) -> Any:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{key}: cannot read {path}: {error.strerror}") from None
    if binary:
        return data.rstrip(b"\r\n")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{key}: {path} is not UTF-8 text") from None
