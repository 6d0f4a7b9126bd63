import sys

from mqttgw.pipeline.cli import main

sys.exit(main())
