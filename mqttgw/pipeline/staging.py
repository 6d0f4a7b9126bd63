"""
All of a run's tables, or none: a run writes what it computed under
``OUT/_staging/RUN/``, then swaps it in.  Before the swap it writes a
journal naming every directory to move; whoever finds a staged run with a
journal (the next run, if this one was killed) finishes the swap, and one
without is thrown away.  Every move is a rename within one file system,
so a reader sees each partition either old or new, never half written.

Directories beginning with "_" are invisible to Spark, pyarrow and DuckDB
readers of the tables.
"""

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

STAGING = "_staging"
JOURNAL = "_SWAP"


def local(out):
    """Only a local (or POSIX shared) file system can rename: not hdfs://, s3a://."""
    return "://" not in str(out)


class Run:
    """One run's staging directory under ``out``."""

    def __init__(self, out, run_id):
        self.out = Path(out)
        self.directory = self.out / STAGING / run_id
        self.directory.mkdir(parents=True)

    def path(self, table):
        return str(self.directory / table)

    def swap(self, partitioned, whole):
        """
        Publish the staged tables: of ``partitioned`` ones, each staged
        partition replaces the one of the same name; ``whole`` ones replace
        the table.  Returns the journal's moves.
        """
        moves = []
        for table in partitioned:
            staged = self.directory / table
            for leaf in _leaves(staged):
                moves.append([table, str(leaf.relative_to(staged))])
        for table in whole:
            if (self.directory / table).is_dir():
                moves.append([table, "."])
        journal = self.directory / JOURNAL
        with open(journal.with_suffix(".tmp"), "w") as f:
            json.dump({"moves": moves}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(journal.with_suffix(".tmp"), journal)
        _fsync_dir(self.directory)
        _apply(self.out, self.directory, moves)
        return moves


def recover(out, say):
    """Finish the swaps a killed run had begun; drop what it only staged."""
    root = Path(out) / STAGING
    if not root.is_dir():
        return
    for directory in sorted(root.iterdir()):
        journal = directory / JOURNAL
        if journal.exists():
            moves = json.loads(journal.read_text())["moves"]
            say(f"finishing the swap of interrupted run {directory.name} ({len(moves)} moves)")
            _apply(Path(out), directory, moves)
        else:
            say(f"discarding interrupted run {directory.name}: it had not begun its swap")
            shutil.rmtree(directory)


def _apply(out, directory, moves):
    # Idempotent: a move whose staged directory is gone was done.
    old = directory / "_old"
    for table, relative in moves:
        staged = directory / table / relative
        if not staged.exists():
            continue
        target = out / table / relative
        for replaced in (target, *_legacy(target)):
            if replaced.exists():
                aside = old / table / relative / replaced.name
                aside.parent.mkdir(parents=True, exist_ok=True)
                os.rename(replaced, aside)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)
    for table in {table for table, _ in moves}:
        mark_complete(out, table)
    shutil.rmtree(directory)
    try:
        directory.parent.rmdir()  # _staging, when no other run is staging
    except OSError:
        pass


def _leaves(table):
    """The partition directories holding data files (``date=…/hour=…``)."""
    if not table.is_dir():
        return []
    leaves = set()
    for data in table.rglob("*.parquet"):
        if data.parent != table:
            leaves.add(data.parent)
    return sorted(leaves)


def _legacy(target):
    """Earlier versions named hours ``hour=07``: replacing ``hour=7`` replaces it too."""
    name = target.name
    if name.startswith("hour=") and name[5:].isdigit() and len(name) < 7:
        yield target.with_name(f"hour={int(name[5:]):02d}")


def mark_complete(out, table):
    """
    ``TABLE/_SUCCESS``, renewed each time the table is written: Spark
    writes none when partitions are replaced one by one.
    """
    if local(out) and (Path(out) / table).is_dir():
        (Path(out) / table / "_SUCCESS").write_text(datetime.now(timezone.utc).isoformat(timespec="seconds") + "\n")


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
