"""
Twisted's TCP transports without an instance dictionary each.

CPython 3.11 keeps an instance's attributes in a small array laid out by
keys its class shares; a name the shared keys do not hold yet gives that
instance a dictionary of its own (about 0.8 KiB).  The room for new names
shrinks by one with every instance made, so a burst of connections at
start-up leaves no room for the names Twisted sets only on the first write
(``dataBuffer``, ``offset``), and every later connection pays for a
dictionary.  Setting every name a live connection uses on one throwaway
instance, before the first connection, puts them all in the shared keys.
Elsewhere this is harmless: the names are only set once, on an object
nobody keeps.
"""

from twisted.internet import tcp

# What tcp.Server and its bases set on a connection that is open: its
# constructor, registerProducer, write and doWrite, pauseProducing.
LIVE_ATTRIBUTES = (
    "reactor", "_tempDataBuffer", "_tempDataLen", "socket", "fileno", "protocol",
    "server", "client", "sessionno", "hostname", "logstr", "repstr", "connected",
    "producer", "streamingProducer", "dataBuffer", "offset", "producerPaused",
)


def share(cls=tcp.Server, names=LIVE_ATTRIBUTES):
    """Put ``names`` in the shared keys of ``cls``'s instances."""
    template = cls.__new__(cls)
    for name in names:
        setattr(template, name, None)
