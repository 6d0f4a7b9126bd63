"""
What the settings and the login know of TLS without loading pyOpenSSL:
the cipher profile offered by default and the identity a client
certificate carries (mqttgw.transports.tls builds the TLS itself).
"""

# Mozilla's "intermediate" profile (version 5.7) for TLS 1.2: keys exchanged with
# forward secrecy (ECDHE, DHE) and authenticated encryption (AES-GCM,
# ChaCha20-Poly1305) only; no plain RSA key exchange, no CBC.  (DHE needs
# DH parameters, which are not loaded, so ECDHE is what is agreed; the DHE
# suites stay as the profile lists them.)  TLS 1.3's own suites are not
# changed by a cipher string.
INTERMEDIATE_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "DHE-RSA-AES128-GCM-SHA256",
        "DHE-RSA-AES256-GCM-SHA384",
        "DHE-RSA-CHACHA20-POLY1305",
    )
)


def peer_identity(transport):
    """
    The common name of the client certificate on ``transport``, or None
    (no TLS, or no certificate).
    """
    get_certificate = getattr(transport, "getPeerCertificate", None)
    if get_certificate is None:
        return None
    certificate = get_certificate()
    if certificate is None:
        return None
    subject = certificate.get_subject()
    return subject.CN
