"""``python -m mqttgw.pipeline``: the pipeline's command (mqttgw.pipeline.command)."""

import sys

from mqttgw.pipeline.command import main

sys.exit(main())
