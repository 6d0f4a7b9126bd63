"""
Where Eclipse Tahu's JavaScript Sparkplug client (``sparkplug-client`` from
npm) is installed, once, by the ``tahu`` fixture (tests/conftest.py).
"""

from tests.gateway import REPO

TAHU_VERSION = "3.2.4"
TAHU = REPO / "tests" / ".cache" / f"sparkplug-client-{TAHU_VERSION}"
