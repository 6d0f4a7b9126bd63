"""
``mqttgw-pipeline connect-server``: a Spark Connect server from the
installed pyspark, kept running so that hourly ``batch --remote`` runs
find Spark warm; it listens on loopback unless told otherwise::

    mqttgw-pipeline connect-server [--host 127.0.0.1] [--port 15002] [--master local[*]] [--dry-run] [-- SPARK-SUBMIT OPTIONS]
"""

import argparse
import ipaddress
import os
import shlex
import sys

from mqttgw.pipeline.spark_home import spark_submit

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Spark's own variable: the server requires this bearer token of every
# client, and pyspark's Connect client sends it.
TOKEN = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


def parser():
    """``mqttgw-pipeline connect-server``'s own options (the rest go to spark-submit)."""
    p = argparse.ArgumentParser(
        prog="mqttgw-pipeline connect-server",
        usage="mqttgw-pipeline connect-server [--host HOST] [--port PORT] [--master MASTER] [--dry-run] [-- SPARK-SUBMIT OPTIONS]",
        description="Run a Spark Connect server here, in the foreground, for batch --remote sc://HOST:PORT.",
    )
    p.add_argument(
        "--host", default="127.0.0.1",
        help="the address it listens on (default 127.0.0.1; any other needs $SPARK_CONNECT_AUTHENTICATE_TOKEN)",
    )
    p.add_argument("--port", type=int, default=15002, help="its gRPC port (default 15002)")
    p.add_argument("--master", default="local[*]", help="where its jobs run (default local[*]: this machine's cores)")
    p.add_argument("--dry-run", action="store_true", help="print the spark-submit line only")
    return p


def loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_line(own, spark_options):
    """The spark-submit command that runs the server in the foreground."""
    conf = [
        f"spark.connect.grpc.binding.address={own.host}",
        f"spark.connect.grpc.binding.port={own.port}",
    ]
    given = " ".join(spark_options)
    if "spark.pyspark.python=" not in given:
        # Python workers (they decode Sparkplug payloads with mqttgw's
        # codec) run this Python, which has mqttgw installed.
        conf.append(f"spark.pyspark.python={sys.executable}")
    options = [o for c in conf for o in ("--conf", c)]
    return [
        spark_submit(), "--class", SERVER_CLASS, "--name", "mqttgw Spark Connect server", "--master", own.master,
        *options, *spark_options,
    ]


def server_env(own, environ):
    """
    The server's environment: with a local master, Spark's other ports
    (its UI, the driver's and the block manager's) on loopback too.
    """
    env = dict(environ)
    if own.master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def main(argv):
    """Checks the options, then becomes the server (or prints its line)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    own = parser().parse_args(argv[:cut])
    spark_options = argv[cut + 1:]
    if not 0 < own.port < 65536:
        raise SystemExit(f"pipeline: connect-server --port must be 1-65535, not {own.port}")
    if not loopback(own.host) and not os.environ.get(TOKEN):
        # Spark Connect runs what a client sends, as this user: never for
        # anyone on the network to send.
        raise SystemExit(
            f"pipeline: connect-server --host {own.host} is reachable from other hosts:"
            f" set {TOKEN} (clients send it too), or keep --host 127.0.0.1"
        )
    line = server_line(own, spark_options)
    if own.dry_run:
        print(shlex.join(line))
        return 0
    print(f"[connect-server] {shlex.join(line)}", file=sys.stderr, flush=True)
    os.execve(line[0], line, server_env(own, os.environ))
