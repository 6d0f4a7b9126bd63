"""
TLS 1.2 cipher suites, from the outside with ``openssl s_client``: by
default only forward-secret AEAD suites (Mozilla's "intermediate"
profile) are accepted, TLS 1.3 as OpenSSL has it; ``tls.ciphers``
(``--ciphers``), a [[listener]] table's ``ciphers`` and a bridge's
``ciphers`` widen the list; a cipher string that names no suite stops
start-up with one line naming the key.  The certificates are RSA ones, so
that plain RSA key exchange could be agreed if it were allowed.
"""

import re
import subprocess
import time

import pytest
import trustme

from tests.config_files import bridge_config
from tests.conftest import require_program
from tests.gateway import TWISTD, gateway_env
from tests.network import LOCAL, endpoint, free_port

RSA = trustme.KeyType.RSA
# No forward secrecy (plain RSA key exchange), CBC with SHA-1, and both.
NOT_FORWARD_SECRET = "AES256-GCM-SHA384"
CBC_SHA1 = "ECDHE-RSA-AES128-SHA"
OLD = "AES128-SHA"
MODERN = "ECDHE-RSA-AES128-GCM-SHA256"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = trustme.CA(key_type=RSA)
    d = tmp_path_factory.mktemp("rsa-pki")
    server = ca.issue_cert(LOCAL, "localhost", key_type=RSA)
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {"cert": str(d / "server.pem"), "key": str(d / "server.key"), "ca": str(d / "ca.pem")}


def agreed(port, pki, *options):
    """The suite ``openssl s_client`` agrees on with ``options``, or None if the handshake fails."""
    out = subprocess.run(
        [require_program("openssl"), "s_client", "-connect", f"{LOCAL}:{port}", "-CAfile", pki["ca"], *options],
        input=b"", capture_output=True, timeout=30,
    )
    text = out.stdout.decode(errors="replace")
    found = re.search(r"^New, (\S+), Cipher is (\S+)$", text, re.M)
    assert found, text + out.stderr.decode(errors="replace")
    if found.group(2) == "(NONE)":
        assert out.returncode != 0
        return None
    return found.group(2)


def tls_gateway(gateway_with, pki, *args):
    port = free_port()
    gateway_with("--tls", endpoint(port), "--cert", pki["cert"], "--key", pki["key"], *args)
    return port


def test_tls_1_2_takes_only_forward_secret_aead_suites_by_default(gateway_with, pki):
    port = tls_gateway(gateway_with, pki)
    for suite in (OLD, NOT_FORWARD_SECRET, CBC_SHA1):
        assert agreed(port, pki, "-tls1_2", "-cipher", suite) is None, suite
    assert agreed(port, pki, "-tls1_2", "-cipher", MODERN) == MODERN
    assert agreed(port, pki, "-tls1_2", "-cipher", "ECDHE-RSA-CHACHA20-POLY1305") == "ECDHE-RSA-CHACHA20-POLY1305"
    # Offered everything, a client gets a forward-secret AEAD suite.
    assert agreed(port, pki, "-tls1_2", "-cipher", "ALL") in (
        "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-CHACHA20-POLY1305",
    )
    # TLS 1.3 is as OpenSSL has it; below 1.2 nothing.
    assert agreed(port, pki, "-tls1_3").startswith("TLS_")
    assert agreed(port, pki, "-tls1_1", "-cipher", "ALL:@SECLEVEL=0") is None


def test_a_wider_list_accepts_the_old_suites(gateway_with, pki, tmp_path):
    wide = free_port()
    config = tmp_path / "listeners.toml"
    config.write_text(
        f'[[listener]]\nkind = "tls"\naddress = "{endpoint(wide)}"\n'
        f'ciphers = "{MODERN}:{NOT_FORWARD_SECRET}"\n'
    )
    port = tls_gateway(gateway_with, pki, "--ciphers", f"{MODERN}:{OLD}", "--config", str(config))
    assert agreed(port, pki, "-tls1_2", "-cipher", OLD) == OLD
    assert agreed(port, pki, "-tls1_2", "-cipher", NOT_FORWARD_SECRET) is None
    # The [[listener]] table's own list.
    assert agreed(wide, pki, "-tls1_2", "-cipher", NOT_FORWARD_SECRET) == NOT_FORWARD_SECRET
    assert agreed(wide, pki, "-tls1_2", "-cipher", OLD) is None


@pytest.mark.parametrize(
    "args,table,message",
    [
        (["--ciphers", "RC4-NONSENSE"], "", "tls.ciphers: no TLS 1.2 cipher suite matches 'RC4-NONSENSE'"),
        # TLS 1.3 suites are not for this list: it would leave TLS 1.2 with none.
        (["--ciphers", "TLS_AES_128_GCM_SHA256"], "", "tls.ciphers: no TLS 1.2 cipher suite matches"),
        ([], 'ciphers = "bogus"\n', "listener tls 8884: listener.ciphers: no TLS 1.2 cipher suite matches 'bogus'"),
    ],
)
def test_a_cipher_string_naming_no_suite_stops_start_up_naming_the_key(tmp_path, pki, args, table, message):
    config = tmp_path / "listeners.toml"
    config.write_text(f'[[listener]]\nkind = "tls"\naddress = "8884"\n{table}')
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--tls", "8883", "--cert", pki["cert"], "--key", pki["key"],
         "--config", str(config), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=gateway_env(),
    )
    assert out.returncode != 0
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_an_empty_listener_ciphers_or_ca_means_the_tls_sections(tmp_path, pki):
    """
    A [[listener]] table's ``ciphers = ""`` or ``ca = ""`` (the example
    file's values) is the row's default: tls.ciphers, not no suite, and
    tls.ca, not unchecked client certificates.
    """
    from mqttgw.service import build, config

    path = tmp_path / "c.toml"
    path.write_text(
        f'[tls]\ncert = "{pki["cert"]}"\nkey = "{pki["key"]}"\nca = "{pki["ca"]}"\n'
        f'require_client_cert = true\nciphers = "{MODERN}:{OLD}"\n'
        '[[listener]]\nkind = "tls"\naddress = "8884"\nciphers = ""\nca = ""\n'
    )
    settings = config.build(config.load_file(str(path)), {})
    [table] = build.check_listener_tables(settings)
    assert table["tls_files"][2:] == (pki["ca"], True, f"{MODERN}:{OLD}", "tls.ciphers")


class OldUpstream:
    """``openssl s_server`` on TLS 1.2 with one old suite: what a bridge's handshake with it shows."""

    def __init__(self, workdir, pki):
        self.port = free_port()
        self.log_path = workdir / f"s_server-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [require_program("openssl"), "s_server", "-accept", f"{LOCAL}:{self.port}",
             "-cert", pki["cert"], "-key", pki["key"], "-tls1_2", "-cipher", OLD],
            # Left open: at the end of its input s_server stops.
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self.wait_for("ACCEPT")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text, timeout=15):
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert time.monotonic() < deadline and self.process.poll() is None, self.log()
            time.sleep(0.05)

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self._log.close()


def test_a_bridge_offers_forward_secret_aead_suites_unless_told_otherwise(tmp_path, pki, gateway_with):
    strict = OldUpstream(tmp_path, pki)
    try:
        address = f"localhost:{strict.port}"
        bridge_config(tmp_path / "strict.toml", [address], tls=True, ca=pki["ca"])
        gw = gateway_with("--config", str(tmp_path / "strict.toml"), "--no-persistence")
        gw.wait_for_log(f"bridge up: upstream {address} TLS handshake failed")
        strict.wait_for("no shared cipher")
        assert "CIPHER is" not in strict.log()
    finally:
        strict.stop()
    wide = OldUpstream(tmp_path, pki)
    try:
        address = f"localhost:{wide.port}"
        bridge_config(tmp_path / "wide.toml", [address], tls=True, ca=pki["ca"], ciphers=f"{MODERN}:{OLD}")
        gateway_with("--config", str(tmp_path / "wide.toml"), "--no-persistence")
        wide.wait_for(f"CIPHER is {OLD}")
    finally:
        wide.stop()
    bridge_config(tmp_path / "bad.toml", [address], tls=True, ca=pki["ca"], ciphers="bogus")
    out = subprocess.run(
        [str(TWISTD), "-n", "--pidfile=", "mqttgw", "--config", str(tmp_path / "bad.toml")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, env=gateway_env(),
    )
    assert out.returncode != 0
    assert "bridge 'up': bridge.ciphers: no TLS 1.2 cipher suite matches 'bogus'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
