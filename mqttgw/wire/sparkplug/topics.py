"""
Sparkplug B topic names (specification chapter 4):
``spBv1.0/GROUP/TYPE/EDGE_NODE[/DEVICE]``, and where a Sparkplug Aware
MQTT Server makes the births available.
"""

NAMESPACE = "spBv1.0"
PREFIX = NAMESPACE + "/"
CERTIFICATES = "$sparkplug/certificates/"

NODE_TYPES = frozenset({"NBIRTH", "NDEATH", "NDATA", "NCMD"})
DEVICE_TYPES = frozenset({"DBIRTH", "DDEATH", "DDATA", "DCMD"})


def parse(topic):
    """
    ``(group, message type, edge node, device or None)`` of a Sparkplug B
    topic, or None for any other topic (``STATE``, a wrong level count, an
    unknown type, an empty identifier).
    """
    parts = topic.split("/")
    if len(parts) == 4:
        namespace, group, kind, node = parts
        device = None
        if kind not in NODE_TYPES:
            return None
    elif len(parts) == 5:
        namespace, group, kind, node, device = parts
        if kind not in DEVICE_TYPES or not device:
            return None
    else:
        return None
    if namespace != NAMESPACE or not group or not node:
        return None
    return group, kind, node, device


def certificate_topic(topic):
    """Where the birth published on ``topic`` is kept, retained."""
    return CERTIFICATES + topic


def source_topic(name):
    """
    The topic (or filter) a certificate topic (or filter) mirrors, or None
    for a name outside ``$sparkplug/certificates/``: who may read the one
    may read the other.
    """
    if name.startswith(CERTIFICATES):
        return name[len(CERTIFICATES):]
    return None
