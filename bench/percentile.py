"""
Percentiles of round trips by nearest rank, the ones that never came back
ranked above every one that did: a broker that drops its slowest replies
does not look quicker for it.
"""

import math


def nearest_rank(values, share, missing=0):
    """
    The ``share`` (0 < share <= 1) percentile of sorted ``values`` plus
    ``missing`` that never came back; None when there is none or it falls
    among the missing.
    """
    count = len(values) + missing
    if not count:
        return None
    rank = max(1, math.ceil(share * count))
    return values[rank - 1] if rank <= len(values) else None
