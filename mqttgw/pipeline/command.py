"""
``mqttgw-pipeline`` (and ``python -m mqttgw.pipeline``): ``batch`` and
``stream`` run the jobs here; ``submit`` runs them through spark-submit,
from the installed package; ``connect-server`` keeps a Spark Connect
server running for them (mqttgw.pipeline.connect_server)::

    mqttgw-pipeline submit [--dry-run] [--zip FILE] [SPARK-SUBMIT OPTIONS] -- batch|stream OPTIONS

The driver's modules (``mqttgw/__init__.py``, ``wire/`` and
``pipeline/``) are zipped from the installed files for ``--py-files``,
the application is the installed ``mqttgw/pipeline/__main__.py`` and the
driver's Python this one, so neither a source checkout nor a zip made by
hand is needed.
"""

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import mqttgw
from mqttgw.pipeline import connect_server
from mqttgw.pipeline.cli import main as run
from mqttgw.pipeline.spark_home import spark_submit

# What the driver imports: nothing of the gateway but its wire format
# (setup.cfg's import-linter contract).
DRIVER_PACKAGES = ("wire", "pipeline")


def package_zip(path):
    """Writes the driver's modules, from the installed files, to ``path``."""
    root = Path(mqttgw.__file__).parent
    files = [root / "__init__.py"]
    for package in DRIVER_PACKAGES:
        # Subpackages too: the Sparkplug tables decode with wire/sparkplug/.
        files += sorted((root / package).rglob("*.py"))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            archive.write(file, f"mqttgw/{file.relative_to(root).as_posix()}")
    return path


def submit_line(zip_path, spark_options, pipeline_args):
    """The spark-submit command for ``pipeline_args`` (``batch ...``)."""
    options = list(spark_options)
    if not any(o.startswith("spark.pyspark.driver.python=") for o in options) and "PYSPARK_DRIVER_PYTHON" not in os.environ:
        # The driver runs where this package is installed, with its Python.
        options += ["--conf", f"spark.pyspark.driver.python={sys.executable}"]
    application = Path(mqttgw.__file__).parent / "pipeline" / "__main__.py"
    return [spark_submit(), *options, "--py-files", str(zip_path), str(application), *pipeline_args]


def submit_parser():
    """``mqttgw-pipeline submit``'s own options (the rest go to spark-submit)."""
    parser = argparse.ArgumentParser(
        prog="mqttgw-pipeline submit",
        usage="mqttgw-pipeline submit [--dry-run] [--zip ZIP] [SPARK-SUBMIT OPTIONS] -- batch|stream OPTIONS",
        description="Run ``batch`` or ``stream`` through spark-submit, from the installed package.",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the spark-submit line (and write the zip) only")
    parser.add_argument("--zip", help="where the package's zip is written (default: a temporary file; ./mqttgw-pipeline.zip with --dry-run)")
    return parser


def submit(argv):
    if "--" not in argv:
        raise SystemExit("pipeline: submit takes [SPARK-SUBMIT OPTIONS] -- batch|stream OPTIONS")
    cut = argv.index("--")
    own, spark_options = submit_parser().parse_known_args(argv[:cut])
    pipeline_args = argv[cut + 1:]
    if pipeline_args[:1] not in (["batch"], ["stream"]):
        raise SystemExit("pipeline: submit runs batch or stream: ... -- batch --archive ... --out ...")
    if own.dry_run:
        line = submit_line(package_zip(Path(own.zip or "mqttgw-pipeline.zip").resolve()), spark_options, pipeline_args)
        print(shlex.join(line))
        return 0
    with tempfile.TemporaryDirectory(prefix="mqttgw-pipeline-") as directory:
        line = submit_line(package_zip(Path(own.zip or Path(directory) / "mqttgw.zip").resolve()), spark_options, pipeline_args)
        print(f"[submit] {shlex.join(line)}", file=sys.stderr, flush=True)
        return subprocess.call(line)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["submit"]:
        return submit(argv[1:])
    if argv[:1] == ["connect-server"]:
        return connect_server.main(argv[1:])
    return run(argv)
