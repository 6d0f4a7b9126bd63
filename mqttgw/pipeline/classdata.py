"""
A class-data archive for the driver's JVM: Spark loads some ten thousand
classes from its jars before the first job, about half of a short run's
start-up.  The first run whose driver starts here records them
(``-XX:ArchiveClassesAtExit``) into the user's cache; later runs map the
archive (``-XX:SharedArchiveFile``) and start in about half the CPU time.

One archive per Spark version and Java installation.  The JVM writes it
as it exits, so the run that records it waits for its JVM to exit and
only then renames the finished file into place: a JVM given a truncated
archive crashes, one given a stale or foreign archive ignores it.
"""

import glob
import hashlib
import os
import shutil
import time
from pathlib import Path

# -Xlog: the JVM's notes on classes it cannot archive (signed jars, old
# class files) would otherwise fill the run's output.
QUIET = "-Xlog:cds*=off"
# Left-over recordings of runs that were killed.
STALE_AFTER = 24 * 3600


def directory():
    """``$XDG_CACHE_HOME/mqttgw/spark`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mqttgw" / "spark"


def _java():
    """The java spark-class runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java else ""


def _key(conf):
    import pyspark

    java = _java()
    stamp = os.stat(java).st_mtime_ns if java and os.path.exists(java) else 0
    parts = [pyspark.__version__, pyspark.__file__, java, str(stamp), conf.get("spark.driver.extraClassPath", "")]
    return f"spark-{pyspark.__version__}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}"


class ClassDataArchive:
    """
    What to add to the driver's JVM options, and, for the run that
    records the archive, :meth:`finish` to put it in place.
    """

    def __init__(self, conf, cache=None):
        self.cache = Path(cache) if cache else directory()
        self.path = self.cache / f"{_key(conf)}.jsa"
        self.recording = None
        # For the run's record: "shared" (mapped), "recording", or None.
        self.state = None
        self.option = ""
        if self.path.is_file():
            self.option = f"-XX:SharedArchiveFile={self.path} {QUIET}"
            self.state = "shared"
            return
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            return  # nowhere to keep it: start as Spark does
        self._forget_stale()
        self.recording = self.cache / f"{self.path.stem}.{os.getpid()}.part"
        self.option = f"-XX:ArchiveClassesAtExit={self.recording} {QUIET}"
        self.state = "recording"

    def java_options(self, given):
        """The driver's ``extraJavaOptions``: the user's, then the archive's."""
        return " ".join(o for o in (given, self.option) if o)

    def finish(self, say, timeout=120):
        """
        After ``spark.stop()``: for the recording run, end the driver's JVM,
        wait while it writes the archive, and move it into place.
        """
        if self.recording is None:
            return
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        process = getattr(gateway, "proc", None)
        try:
            if process is None:
                return  # not a JVM this process started
            gateway.shutdown()
            # The JVM exits when its stdin closes, and records as it exits.
            process.stdin.close()
            process.wait(timeout)
            if process.returncode == 0 and self.recording.is_file():
                os.replace(self.recording, self.path)
                say(f"recorded Spark's classes in {self.path}: later runs start faster")
        except Exception as e:  # the tables are written; only the speed-up is lost
            say(f"Spark's classes were not recorded: {type(e).__name__}: {e}")
        finally:
            SparkContext._gateway = SparkContext._jvm = None
            if self.recording.exists():
                self.recording.unlink()

    def _forget_stale(self):
        for part in glob.glob(str(self.cache / "*.part")):
            try:
                if time.time() - os.stat(part).st_mtime > STALE_AFTER:
                    os.unlink(part)
            except OSError:
                pass
