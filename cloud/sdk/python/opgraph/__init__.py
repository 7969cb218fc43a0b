"""Opgraph's Python SDK: one client for the cloud's HTTP API, standard
library only.

    import opgraph

    client = opgraph.Client()  # OPGRAPH_URL and OPGRAPH_API_KEY
    client.ingest({"event": "pallet.scanned", "actor": "reader-1"})

Modules: ``client`` (settings and one method per call), ``_http`` (one
exchange and the retry rules), ``errors`` (what a call raises).
"""

from ._http import VERSION as __version__
from .client import DEFAULT_URL, Client
from .errors import ApiError, OpgraphError, TransportError

__all__ = [
    "Client",
    "DEFAULT_URL",
    "OpgraphError",
    "ApiError",
    "TransportError",
    "__version__",
]
