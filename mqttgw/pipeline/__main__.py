import sys

from mqttgw.pipeline.command import main

sys.exit(main())
