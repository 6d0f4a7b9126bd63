"""The protocol versions a test of shared behaviour runs for, as pytest marks."""

import pytest

from mqttgw.testing import V5, V31, V311

# MQTT 3.1 and 3.1.1: behaviour 5.0 changes (reason codes, properties).
both_versions = pytest.mark.parametrize("version", [V31, V311], ids=["3.1", "3.1.1"])
# Every version: behaviour they share.
every_version = pytest.mark.parametrize("version", [V31, V311, V5], ids=["3.1", "3.1.1", "5.0"])
