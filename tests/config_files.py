"""
Configuration as the gateway is given it: a twistd command line parsed
into its options, and mqttgw.toml files written (one with a [[bridge]]
table).
"""

from mqttgw.service.tap import Options

# The rules of the bridge bridge_config writes unless given others.
RULES = [
    "local/out/# out 2",
    "remote/in/# in 2",
    "shared/# both 2",
    "a/# out 1 site/ up/site/",
    "b/# in 1 site/ up/site/",
]


def parse(*args):
    options = Options()
    options.parseOptions(list(args))
    return options


def write(tmp_path, text):
    path = tmp_path / "mqttgw.toml"
    path.write_text(text)
    return str(path)


def bridge_config(path, addresses, rules=RULES, **extra):
    lines = [
        "[[bridge]]",
        'name = "up"',
        "addresses = [" + ", ".join(f'"{a}"' for a in addresses) + "]",
        "rules = [" + ", ".join(f'"{r}"' for r in rules) + "]",
        "reconnect_initial = 0.2",
        "reconnect_max = 1.0",
        "keepalive = 5",
    ]
    lines += [f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {str(v).lower()}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)
