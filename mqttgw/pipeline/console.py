"""What the pipeline's jobs tell the person running them, on stderr."""

import sys
from datetime import datetime


def say(text):
    print(f"[{datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)
