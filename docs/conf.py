"""
Sphinx configuration of mqttgw's manual: the site (``sphinx-build -W -b
html docs docs/_build/html``) and the manual pages (``-b man``).  The
reference pages are written at build time by ``_ext/mqttgw_reference.py``
from the code, never by hand.
"""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here.parent), str(here / "_ext")]

import mqttgw  # noqa: E402

project = "mqttgw"
author = "the mqttgw authors"
copyright = "the mqttgw authors"
release = version = mqttgw.__version__

extensions = ["mqttgw_reference"]
exclude_patterns = ["_build"]
# Every cross-reference must resolve: a broken one fails the -W build.
nitpicky = True
# ``code`` by default, as the README writes it.
default_role = "literal"

html_theme = "furo"
html_title = f"mqttgw {release}"

# (source, name, description, authors, section)
man_pages = [
    ("man/mqttgw", "mqttgw", "MQTT broker and gateway (twistd mqttgw)", [], 8),
    ("man/mqttgw.toml", "mqttgw.toml", "mqttgw configuration file", [], 5),
    ("man/mqttgw-ctl", "mqttgw-ctl", "talk to a running mqttgw's admin API", [], 8),
    ("man/mqttgw-passwd", "mqttgw-passwd", "manage mqttgw password files", [], 1),
]
man_show_urls = False
