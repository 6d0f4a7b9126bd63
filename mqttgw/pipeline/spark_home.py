"""Where the Spark that runs the pipeline's jobs is installed, and its scripts."""

import importlib.util
import os
from pathlib import Path


def spark_home():
    """$SPARK_HOME, else the installed pyspark's directory (which brings Spark's scripts and jars)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    spec = importlib.util.find_spec("pyspark")
    if spec is None:
        raise SystemExit("pipeline: no pyspark installed and no SPARK_HOME: pip install 'mqttgw[pipeline]'")
    return Path(spec.submodule_search_locations[0])


def spark_submit():
    """$SPARK_HOME's spark-submit, else the one the installed pyspark brings."""
    return str(spark_home() / "bin" / "spark-submit")
