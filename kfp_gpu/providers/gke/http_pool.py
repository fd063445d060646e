"""HTTP connection pools of the google-cloud REST clients, sized to the provider's concurrency.

A REST transport talks through one ``requests`` session whose adapter keeps 10 connections per host;
:meth:`GkeProvider.parallel` runs up to 16 calls at once (nested: quota -> pools), so the 11th
concurrent call's connection was discarded with urllib3's "Connection pool is full" warning.
"""

from __future__ import annotations

from typing import Any

POOL_SIZE = 64  # >= GkeProvider.parallel's 16 workers, with room for nested parallel calls


def size_pool(rest_client: Any, size: int = POOL_SIZE) -> Any:
    """Give ``rest_client``'s session (``client._transport._session``) adapters of ``size`` connections.
    A client without a requests session (another transport) is returned unchanged.

    Raises: nothing.
    """
    session = getattr(getattr(rest_client, "_transport", None), "_session", None)
    mount = getattr(session, "mount", None)
    if mount is None:
        return rest_client
    from requests.adapters import HTTPAdapter

    for prefix in ("https://", "http://"):
        mount(prefix, HTTPAdapter(pool_connections=4, pool_maxsize=size))
    return rest_client
