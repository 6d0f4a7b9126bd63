"""The ``[archive]`` section's keys: what is recorded, where (schema rows)."""

from mqttgw.schema import Key

ARCHIVE_KEYS = [
    Key(
        "archive",
        "directory",
        str,
        "",
        "record messages as Parquet segments in this directory (empty: off)",
        flag_name="archive",
        doc=(
            "Segments are partitioned ``date=YYYY-MM-DD/hour=HH/`` (UTC), for"
            " the PySpark pipeline (``python -m mqttgw.pipeline``).  Needs "
            "the ``archive`` extra (pyarrow)."
        ),
    ),
    Key("archive", "include", list, ["#"], "topic filters to record", flag_name="archive-include"),
    Key("archive", "exclude", list, [], "topic filters not to record", flag_name="archive-exclude"),
    Key(
        "archive",
        "directions",
        list,
        ["in", "bridge_in", "bridge_out"],
        "what to record: in, out, bridge_in, bridge_out",
        flag_name="archive-direction",
        doc=(
            "``in``: published by clients; ``out``: each delivery to a "
            "client, one row per subscriber; ``bridge_in``: brought in by "
            "bridges; ``bridge_out``: forwarded upstream."
        ),
    ),
    Key(
        "archive", "roll_seconds", float, 60.0, "seconds before a segment is closed", 0.001,
        doc=(
            "A segment is closed (and renamed in from ``_tmp/``) after "
            "roll_seconds or roll_rows, whichever comes first, at each hour "
            "boundary, and on shutdown."
        ),
    ),
    Key(
        "archive", "roll_rows", int, 100_000, "rows before a segment is closed", 1,
        doc="Whichever of roll_seconds and roll_rows comes first closes it.",
    ),
    Key(
        "archive", "gateway_id", str, "", "this gateway's id in the archive (default: host name)",
        doc=(
            "The archive's ``gateway_id`` column, by which the pipeline tells"
            " gateways' archives apart."
        ),
    ),
]
