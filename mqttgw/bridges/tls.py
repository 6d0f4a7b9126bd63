"""
TLS toward an upstream: the authorities its certificate is checked
against, the bridge's client certificate, and the cipher suites offered.
"""

from twisted.internet import ssl

from mqttgw.schema import ConfigError
from mqttgw.transports.tls import acceptable_ciphers, pem_certificates, read_file


def client_tls_options(settings, hostname):
    """The bridge's TLS options toward ``hostname``, from its ca, cert, key and ciphers."""
    where = f"bridge {settings.name!r}"
    trust = None
    if settings.ca:
        [authority, *_] = pem_certificates(read_file(settings.ca, f"{where} ca"), settings.ca, f"{where} ca")
        trust = ssl.Certificate(authority)
    client = None
    if settings.cert:
        try:
            client = ssl.PrivateCertificate.loadPEM(
                read_file(settings.cert, f"{where} cert") + b"\n" + read_file(settings.key or settings.cert, f"{where} key")
            )
        except Exception as e:
            raise ConfigError(f"{where}: client certificate {settings.cert}: {e}") from None
    # As the listeners': TLS 1.2 at least, forward-secret AEAD suites by default.
    return ssl.optionsForClientTLS(
        hostname,
        trustRoot=trust,
        clientCertificate=client,
        extraCertificateOptions={
            "raiseMinimumTo": ssl.TLSVersion.TLSv1_2,
            "acceptableCiphers": acceptable_ciphers(settings.ciphers, f"{where}: bridge.ciphers"),
        },
    )
