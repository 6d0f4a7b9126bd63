"""
Bridges added, changed and removed at runtime through the admin API, kept
in ``bridges.json`` in the data directory so they outlive restarts and
SIGHUP.  The configuration file stays the default: a runtime entry adds a
bridge, replaces one of the file's by its name, or removes one (a
tombstone), and the two are merged whenever the bridges are built.

The file is written in a thread (the reactor never waits on the disk), by
a temporary file renamed over the old one, readable by its owner only (a
bridge's table may hold a password).
"""

import json
import os
from pathlib import Path

from twisted.internet.threads import deferToThread

from mqttgw.schema import ConfigError

FILE_NAME = "bridges.json"


class RuntimeBridges:
    """``path``: the file, or None without persistence (then nothing is kept)."""

    def __init__(self, path=None):
        self.path = None if path is None else Path(path)
        # name -> the [[bridge]] table, or None: removed.
        self.entries = {}

    @classmethod
    def in_data_dir(cls, settings):
        persistence = settings.persistence
        if not persistence.enabled:
            return cls()
        return cls(Path(persistence.data_dir) / FILE_NAME)

    def load(self):
        """At start-up; a file that cannot be read stops it with one line."""
        if self.path is None or not self.path.exists():
            return self
        try:
            entries = json.loads(self.path.read_text())
            if not isinstance(entries, dict) or not all(
                isinstance(v, dict) or v is None for v in entries.values()
            ):
                raise ValueError("not an object of bridge tables")
        except (OSError, ValueError) as e:
            raise ConfigError(f"runtime bridges {self.path}: {e}") from None
        self.entries = entries
        return self

    def merged(self, tables, entries=None):
        """The file's ``tables`` with the runtime entries applied, in order."""
        entries = self.entries if entries is None else entries
        out = []
        seen = set()
        for table in tables:
            name = table.get("name")
            seen.add(name)
            if name in entries:
                if entries[name] is not None:
                    out.append(entries[name])
            else:
                out.append(table)
        out += [t for name, t in entries.items() if name not in seen and t is not None]
        return out

    def changed(self, name, table):
        """The entries with ``name`` set to ``table`` (None: removed)."""
        entries = dict(self.entries)
        entries[name] = table
        return entries

    def save(self, entries):
        """Keep ``entries``: a Deferred that fires once they are on disk."""
        if self.path is None:
            self.entries = entries
            return deferToThread(lambda: None)
        path = self.path

        def write():
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

        d = deferToThread(write)

        def kept(_):
            self.entries = entries

        d.addCallback(kept)
        return d
