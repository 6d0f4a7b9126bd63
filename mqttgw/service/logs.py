"""
The log as operators read it: a level that SIGHUP can change, text or JSON
lines with stable field names, and repeated warnings summarised rather
than repeated (``mqttgw.broker.logsummary``).  Under ``twistd`` the observer is installed through its
``--logger`` hook, so ``--logfile`` and ``--nodaemon`` keep their meaning
(and SIGUSR1 rotates the log file, as twistd's own observer does).
"""

import math
import sys
import time
from datetime import datetime, timezone

from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    jsonFileLogObserver,
    textFileLogObserver,
)
from twisted.python.logfile import LogFile

LEVELS = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "error": LogLevel.error,
    "critical": LogLevel.critical,
}

# One predicate for the process, so that a reload changes the level of
# whatever observer is in use.
level_filter = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)

# The log file when logging to one (SIGUSR1 rotates it), else None.
log_file = None


def set_level(name):
    # The root namespace's level is every namespace's unless set apart.
    level_filter.setLogLevelForNamespace("", LEVELS[name])


# What an event's own field may hold to be written as it is: the values
# operators filter on.  Objects (a protocol, an address) are left to the
# message, which carries their text.
_PLAIN = (str, int, float, bool, type(None))


def json_record(event):
    """
    The line an event becomes: ``time`` (UTC, ISO 8601, milliseconds),
    ``level``, ``namespace``, ``message`` (the formatted text),
    ``traceback`` for failures, and the event's own fields of plain types
    or lists of them (``client_id``, ``peer``, ``topic``...).  Those four
    names are kept whatever a field of the event is called.
    """
    record = {
        "time": datetime.fromtimestamp(event.get("log_time", time.time()), timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "level": event["log_level"].name if "log_level" in event else "info",
        "namespace": event.get("log_namespace", ""),
        "message": formatEvent(event),
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["traceback"] = failure.getTraceback()
    for key, value in event.items():
        if key.startswith("log_") or key in record:
            continue
        if isinstance(value, _PLAIN) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value)
        ):
            record[key] = _finite(value)
    return record


def _finite(value):
    # JSON has no NaN or infinity: json.dumps would write a token that
    # strict readers refuse, so they are written as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_observer(out):
    """
    One JSON object per line (:func:`json_record`), written by Twisted's
    own ``jsonFileLogObserver``; with no record separator, as its default
    RS character would make each line more than plain JSON.
    """
    write = jsonFileLogObserver(out, recordSeparator="")

    def observe(event):
        write(json_record(event))

    return observe


def make_observer(out, log_format):
    base = json_observer(out) if log_format == "json" else textFileLogObserver(out)
    return FilteringLogObserver(base, [level_filter])


# Set by the plugin's options: twistd's own options, and the format.
_twistd = {"config": None, "format": "text"}


def use_under_twistd(twistd_config, log_format):
    """
    Have twistd log through :func:`twistd_observer` (unless ``--logger``
    names another observer).
    """
    if twistd_config.get("logger") is None:
        _twistd.update(config=twistd_config, format=log_format)
        twistd_config["logger"] = "mqttgw.service.logs.twistd_observer"


def twistd_observer():
    """
    twistd's ``logger``: where twistd would log (stdout with
    ``--nodaemon`` and no file, or ``--logfile=-``; else the log file,
    which SIGUSR1 rotates), filtered by level, in the chosen format.
    """
    global log_file
    twistd_config = _twistd["config"] or {}
    name = twistd_config.get("logfile", "")
    nodaemon = twistd_config.get("nodaemon", False)
    if name == "-" or (nodaemon and not name):
        if not nodaemon:
            sys.exit("mqttgw: a daemon cannot log to stdout: give --logfile")
        out = sys.stdout
    else:
        out = log_file = LogFile.fromFullPath(name or "twistd.log")
    return make_observer(out, _twistd["format"])
