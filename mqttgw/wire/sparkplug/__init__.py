"""
Eclipse Sparkplug B 3.0: its topic namespace (``topics``, plain Python) and
its protobuf payload (``payload``, needs the ``protobuf`` package).  Pure:
no I/O, no clock.  Only what reads field payloads imports ``payload``.
"""
