"""Who the peer of a connection is, as its carrier knows it: the ``mtls:`` server endpoint
(TLS that requires a client certificate signed by a given CA), the principal name in such a
certificate, and the uid of a ``unix:`` socket's peer.

``mtls:PORT:privateKey=key.pem[:certKey=cert.pem]:caCerts=ca.pem[:interface=...]`` is Twisted's
``ssl:`` endpoint plus ``caCerts``, a PEM file of the CAs whose certificates clients must show;
a client without one, with one another CA signed, or with an expired one fails the TLS
handshake and never reaches a protocol. Twisted finds the parser as a plugin; `server_endpoint`
parses ``mtls:`` itself too, so it works wherever the plugin scan does not. The endpoint's
`authorities` (`ClientAuthorities`) can be given the CA file again (a reload): the handshakes to
come take the new CAs, and `admits` says whether a chain an open connection showed still leads
to one of them.
"""

from __future__ import annotations

import pwd
import socket
import struct
from pathlib import Path
from typing import Any

from twisted.internet.endpoints import SSL4ServerEndpoint, serverFromString
from twisted.internet.interfaces import (
    IOpenSSLServerConnectionCreator,
    IStreamServerEndpointStringParser,
)
from twisted.plugin import IPlugin
from zope.interface import implementer

from wireproto.transports.connect import split_endpoint

__all__ = [
    "CERTIFICATE_NAMES",
    "ClientAuthorities",
    "MutualTLSServerEndpoint",
    "MutualTLSServerParser",
    "mtls_server_endpoint",
    "server_endpoint",
    "certificate_name",
    "peer_certificate_name",
    "peer_certificates",
    "unix_peer_user",
]

# Where a client certificate names its principal.
CERTIFICATE_NAMES = ("cn", "san-dns", "san-email", "san-uri")


def _pem_certificates(path: str) -> list[Any]:
    """The certificates of a PEM file (cryptography's); ValueError naming the file."""
    from cryptography import x509

    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"mtls: cannot read {path}: {error.strerror}") from None
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise ValueError(f"mtls: {path} holds no PEM certificate: {error}") from None


def _certificates(path: str) -> list[Any]:
    from OpenSSL import crypto

    return [crypto.X509.from_cryptography(certificate) for certificate in _pem_certificates(path)]


def _issued_by(certificate: Any, issuer: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):  # another issuer, another key type
        return False
    return True


class ClientAuthorities:
    """The CAs whose client certificates an ``mtls:`` listener takes, read from `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.certificates: tuple[Any, ...] = tuple(_pem_certificates(path))

    def read(self) -> tuple[Any, ...]:
        """The CAs `path` holds now; ValueError naming the file if it cannot be used."""
        return tuple(_pem_certificates(self.path))

    def take(self, certificates: tuple[Any, ...]) -> None:
        """Admit the handshakes to come by `certificates` (what `read` gave)."""
        self.certificates = certificates

    def admits(self, chain: tuple[bytes, ...]) -> bool:
        """Whether a chain a connection showed (DER, its certificate first, then each issuer)
        still leads to one of the CAs: a certificate of it is signed by one of them."""
        from cryptography import x509

        certificates = [x509.load_der_x509_certificate(der) for der in chain]
        for index, certificate in enumerate(certificates):
            if any(_issued_by(certificate, ca) for ca in self.certificates):
                return True
            following = certificates[index + 1:index + 2]
            if not following or not _issued_by(certificate, following[0]):
                return False
        return False


@implementer(IOpenSSLServerConnectionCreator)
class _ClientCertificateTLS:
    """TLS that requires a client certificate signed by one of `authorities`, as they are at
    each handshake: a new context is made when they change."""

    def __init__(self, authorities: ClientAuthorities, **options: Any) -> None:
        self.authorities = authorities
        self._options = options
        self._made_for: tuple[Any, ...] | None = None
        self._current: Any = None
        # A key that does not fit its certificate fails here, before anything listens.
        self.getContext()

    def _context_options(self) -> Any:
        from OpenSSL import crypto
        from twisted.internet import ssl

        authorities = self.authorities.certificates
        if authorities is not self._made_for:
            self._current = ssl.CertificateOptions(
                verify=True, requireCertificate=True,
                caCerts=[crypto.X509.from_cryptography(ca) for ca in authorities],
                **self._options,
            )
            self._made_for = authorities
        return self._current

    def serverConnectionForTLS(self, protocol: Any) -> Any:
        return self._context_options().serverConnectionForTLS(protocol)

    def getContext(self) -> Any:
        return self._context_options().getContext()


class MutualTLSServerEndpoint(SSL4ServerEndpoint):
    """Twisted's TLS server endpoint, with the `authorities` its client certificates need."""

    def __init__(self, reactor: Any, port: int, tls: _ClientCertificateTLS, **kwargs: Any) -> None:
        super().__init__(reactor, port, tls, **kwargs)
        self.authorities = tls.authorities


def mtls_server_endpoint(
    reactor: Any, port: str, privateKey: str | None = None, certKey: str | None = None,
    caCerts: str | None = None, interface: str = "", backlog: str = "50",
    extraCertChain: str | None = None,
) -> MutualTLSServerEndpoint:
    """A TLS server endpoint that requires client certificates signed by a CA in `caCerts`."""
    if not privateKey:
        raise ValueError("mtls: needs privateKey=KEY.pem (and certKey=CERT.pem if apart)")
    if not caCerts:
        raise ValueError("mtls: needs caCerts=CA.pem, the CAs that sign client certificates")
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from OpenSSL import crypto

    try:
        key_pem = Path(privateKey).read_bytes()
    except OSError as error:
        raise ValueError(f"mtls: cannot read {error.filename}: {error.strerror}") from None
    try:
        loaded = load_pem_private_key(key_pem, None)
        # the kinds pyOpenSSL takes (no DH, no post-quantum key), in its own words
        if not isinstance(loaded, (dsa.DSAPrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey,
                                   ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
            raise TypeError("Unsupported key type")
        key = crypto.PKey.from_cryptography_key(loaded)
    except (ValueError, TypeError) as error:
        raise ValueError(f"mtls: privateKey {privateKey}: {error}") from None
    certificate = _certificates(certKey or privateKey)[0]
    chain = _certificates(extraCertChain) if extraCertChain else None
    tls = _ClientCertificateTLS(ClientAuthorities(caCerts), privateKey=key,
                                certificate=certificate, extraCertChain=chain)
    return MutualTLSServerEndpoint(reactor, int(port), tls, backlog=int(backlog),
                                   interface=interface)


@implementer(IPlugin, IStreamServerEndpointStringParser)
class MutualTLSServerParser:
    """The ``mtls:`` server endpoint string, for Twisted's plugin system."""

    prefix = "mtls"

    def parseStreamServer(self, reactor: Any, *args: object,
                          **kwargs: object) -> MutualTLSServerEndpoint:
        # the endpoint string's fields, which Twisted hands over as str
        return mtls_server_endpoint(reactor, *map(str, args),
                                    **{key: str(value) for key, value in kwargs.items()})


def server_endpoint(reactor: Any, description: str) -> Any:
    """`serverFromString`, with ``mtls:`` parsed here."""
    args, kwargs = split_endpoint(description)
    if args and args[0].lower() == "mtls":
        return mtls_server_endpoint(reactor, *args[1:], **kwargs)
    return serverFromString(reactor, description)


def certificate_name(certificate: Any, which: str = "cn") -> str | None:
    """The principal name in a peer certificate (a cryptography or pyOpenSSL one): its subject's
    common name, or its first DNS name, e-mail address or URI in the subject alternative
    names."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = certificate.to_cryptography() if hasattr(certificate, "to_cryptography") \
        else certificate
    if which == "cn":
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        value = names[0].value if names else None
        return value if isinstance(value, str) and value else None
    kind = {"san-dns": x509.DNSName, "san-email": x509.RFC822Name,
            "san-uri": x509.UniformResourceIdentifier}[which]
    try:
        alternatives = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return None
    values = alternatives.value.get_values_for_type(kind)
    return values[0] if values else None


def peer_certificate_name(transport: Any, which: str = "cn") -> str | None:
    """The principal name in the certificate `transport`'s TLS peer showed, or None."""
    chain = peer_certificates(transport)
    return certificate_name(chain[0], which) if chain else None


def peer_certificates(transport: Any) -> tuple[Any, ...]:
    """The certificate `transport`'s TLS peer showed, then the rest of the chain it was
    verified with, up to the CA (cryptography certificates); () if it showed none."""
    get = getattr(transport, "getPeerCertificate", None)
    certificate = get() if get is not None else None
    if certificate is None:
        return ()
    handle = getattr(transport, "getHandle", None)
    connection = handle() if handle is not None else None
    verified = getattr(connection, "get_verified_chain", None)
    chain = (verified() if verified is not None else None) or [certificate]
    return tuple(c.to_cryptography() if hasattr(c, "to_cryptography") else c for c in chain)


def unix_peer_user(transport: Any) -> str | None:
    """The user name (or ``uid:N`` for a uid without one) of a unix socket's peer process."""
    try:
        handle = transport.getHandle()
        raw = handle.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"
