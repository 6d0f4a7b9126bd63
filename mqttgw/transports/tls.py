"""
TLS for listeners: server options from PEM files (TLS 1.2 and newer, its
suites forward-secret AEAD ones by default, see tlsprofile), renewable by
SIGHUP.  Imported only where TLS is configured: it loads pyOpenSSL.
"""

from OpenSSL import SSL, crypto
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from zope.interface import implementer

from mqttgw.schema import ConfigError
from mqttgw.transports.tlsprofile import INTERMEDIATE_CIPHERS


def acceptable_ciphers(cipher_string, what):
    """
    The suites an OpenSSL cipher string names, for TLS 1.2; a ConfigError
    naming the setting (``what``) when it names none OpenSSL knows.
    """
    try:
        # OpenSSL's own parse: an error when no TLS 1.2 suite matches.
        SSL.Context(SSL.TLS_METHOD).set_cipher_list(cipher_string.encode("ascii"))
    except (SSL.Error, UnicodeEncodeError):
        raise ConfigError(f"{what}: no TLS 1.2 cipher suite matches {cipher_string!r}") from None
    return ssl.AcceptableCiphers.fromOpenSSLCipherString(cipher_string)


def read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read: {e.strerror}") from None


def pem_certificates(pem, path, what):
    """Every certificate in a PEM file, in order."""
    marker = b"-----BEGIN CERTIFICATE-----"
    blocks = [marker + b for b in pem.split(marker)[1:]]
    if not blocks:
        raise ConfigError(f"{what} {path}: no PEM certificate in it")
    try:
        return [crypto.load_certificate(crypto.FILETYPE_PEM, b) for b in blocks]
    except crypto.Error as e:
        raise ConfigError(f"{what} {path}: not a valid certificate: {e}") from None


def server_options(
    cert, key, ca=None, require_client_cert=False, ciphers=INTERMEDIATE_CIPHERS, ciphers_key="tls.ciphers"
):
    """
    ``CertificateOptions`` for a TLS listener.  ``cert`` may hold the
    server certificate followed by its chain; ``ca`` holds the authorities
    client certificates are checked against; ``ciphers`` is the OpenSSL
    cipher string for TLS 1.2 (the setting ``ciphers_key``).  Any
    unreadable or mismatched file, or a cipher string that names no
    suite, is a ConfigError naming it.
    """
    acceptable = acceptable_ciphers(ciphers, ciphers_key)
    chain = pem_certificates(read_file(cert, "tls.cert"), cert, "tls.cert")
    try:
        private_key = crypto.load_privatekey(
            crypto.FILETYPE_PEM, read_file(key, "tls.key")
        ).to_cryptography_key()
    except crypto.Error as e:
        raise ConfigError(f"tls.key {key}: not a valid private key: {e}") from None
    authorities = pem_certificates(read_file(ca, "tls.ca"), ca, "tls.ca") if ca else None
    if require_client_cert and not authorities:
        raise ConfigError("tls.require_client_cert needs tls.ca")
    try:
        options = ssl.CertificateOptions(
            # pyOpenSSL wants cryptography's objects for these (its own are
            # deprecated there); the authorities stay its own, for its store.
            privateKey=private_key,
            certificate=chain[0].to_cryptography(),
            extraCertChain=[c.to_cryptography() for c in chain[1:]],
            verify=bool(authorities),
            caCerts=authorities,
            requireCertificate=require_client_cert,
            raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
            acceptableCiphers=acceptable,
        )
        # Checks now, not at the first handshake, that key and cert match.
        options.getContext()
    except Exception as e:
        raise ConfigError(
            f"tls.cert {cert} and tls.key {key} cannot be used together: {e}"
        ) from None
    return options


@implementer(IOpenSSLServerConnectionCreator)
class ReloadableServerTLS:
    """
    A TLS listener's certificate and key that SIGHUP can replace: each new
    handshake uses the options in force, connections already up keep theirs.
    """

    def __init__(self, options, load):
        self.options = options
        # Builds fresh options from the files (raises ConfigError).
        self.load = load

    def serverConnectionForTLS(self, protocol):
        return SSL.Connection(self.options.getContext(), None)
