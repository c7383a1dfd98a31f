"""How a client reaches a hub: past or through the HTTP proxy the environment names,
and what it says when the hub cannot be had.

httpx and urllib send every request through ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
unless ``NO_PROXY`` names its host, and neither leaves out this machine by itself. On a
machine set up for a corporate proxy, with no ``NO_PROXY`` for ``127.0.0.1``, every call
to a hub on loopback went to the proxy: a proxy that does not answer held each hook to
its timeout, one that answers 403 or 502 made the hub look down, and each request handed
the member's bearer token to the proxy. A hub on this machine is never reached through a
proxy; a hub elsewhere is, as the environment says (and ``NO_PROXY`` still counts).

What is said when the hub cannot be had names the cause and the way out, the same for
the CLI, the SDK and the hooks: a certificate this machine does not trust
(:func:`untrusted_certificate`), and an answer that is not the hub's, such as a reverse
proxy's 502 page when the hub behind it is down (:func:`not_the_hub`).

Standard library only: the lean command hook and the keeper import it.
"""

from __future__ import annotations

import html
import ipaddress
import os
import re
import urllib.parse

__all__ = ["loopback", "not_the_hub", "proxy_named", "unanswered", "untrusted_certificate"]


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


def untrusted_certificate(exc: BaseException) -> str | None:
    """What to say when ``exc`` (or what it was raised from) is a TLS certificate this
    machine does not trust, such as a hub's self-signed one; ``None`` for any other
    failure. Trying again does not help, so the caller says it at once."""
    import ssl

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError) or (
            "CERTIFICATE_VERIFY_FAILED" in str(seen)
        ):
            why = getattr(seen, "verify_message", None) or str(seen)
            return (
                f"its TLS certificate is not trusted here ({why}); if the hub uses a "
                "certificate of its own (self-signed, or signed by your own CA), set "
                "SSL_CERT_FILE to that certificate or the CA's PEM file, or use the URL "
                "the certificate names"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def unanswered(url: str, exc: BaseException) -> tuple[str, str]:
    """What to say, and the way out, when asking the hub at ``url`` failed with ``exc``
    before any answer (for the checks of ``status`` and ``doctor``, which say it once
    rather than try again): a certificate not trusted here, a proxy the environment
    names for a hub elsewhere, no answer in time, or nothing listening."""
    if (why := untrusted_certificate(exc)) is not None:
        what, _, way_out = why.partition("; ")
        return f"the hub at {url} was not used: {what}", way_out
    kinds = {k.__name__ for k in type(exc).__mro__}
    if proxy_named(url) and not loopback(url):
        return (
            f"the hub at {url} was not reached through the proxy the environment names ({exc})",
            "check HTTPS_PROXY/HTTP_PROXY/ALL_PROXY, or add the hub's host to NO_PROXY "
            "to reach it directly",
        )
    if "TimeoutException" in kinds:
        return f"the hub at {url} did not answer in time ({exc or 'timed out'})", (
            "is it overloaded, or stopped (Ctrl-Z)? `backchannel serve` logs say which"
        )
    return f"the hub at {url} does not answer ({exc})", (
        "start it (`backchannel serve`), or use the URL it printed"
    )


def not_the_hub(status: int, body: bytes | str) -> str:
    """What to say of an answer with no backchannel error body: something other than
    the hub answered (a reverse proxy whose hub is down, a wrong URL or port)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    words = " ".join(html.unescape(re.sub(r"<[^>]*>", " ", text)).split())[:160]
    seen = f" ({words})" if words else ""
    if status in (502, 503, 504):
        way_out = (
            "a proxy in front of the hub answered for it: is `backchannel serve` running "
            "behind it, and is the proxy's upstream the hub's address?"
        )
    else:
        way_out = "is the URL the hub's (the address `backchannel serve` printed)?"
    return f"the answer ({status}) is not the hub's{seen}; {way_out}"
