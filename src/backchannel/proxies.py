"""Which requests to a hub go through the HTTP proxy the environment names.

httpx and urllib send every request through ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
unless ``NO_PROXY`` names its host, and neither leaves out this machine by itself. On a
machine set up for a corporate proxy, with no ``NO_PROXY`` for ``127.0.0.1``, every call
to a hub on loopback went to the proxy: a proxy that does not answer held each hook to
its timeout, one that answers 403 or 502 made the hub look down, and each request handed
the member's bearer token to the proxy. A hub on this machine is never reached through a
proxy; a hub elsewhere is, as the environment says (and ``NO_PROXY`` still counts).

Standard library only: the lean command hook and the keeper import it.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.parse

__all__ = ["loopback", "proxy_named"]


def loopback(url: str) -> bool:
    """``url``'s host is this machine: ``localhost`` (or a name under ``.localhost``), a
    loopback address, or the unspecified address (``0.0.0.0``, ``::``), which connects
    here."""
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return False
    if not host:
        return False
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def proxy_named(url: str) -> bool:
    """The environment names a proxy for ``url``'s scheme (``HTTP_PROXY``,
    ``HTTPS_PROXY`` or ``ALL_PROXY``, in either case), whatever ``NO_PROXY`` says."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    names = (f"{scheme}_proxy", "all_proxy")
    return any(os.environ.get(n) or os.environ.get(n.upper()) for n in names)
