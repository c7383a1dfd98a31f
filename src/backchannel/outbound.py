"""The hub's HTTP clients for registered callback services, with bounded answers.

Every request the hub makes to the outside (a webhook delivery, a POST of the outbox to
another hub, a call to an A2A agent) goes through :func:`client`. What comes back is the
other side's to choose, so the hub bounds what it reads of it:

* at most :data:`MAX_ANSWER` bytes of any answer (an A2A task or agent card is far below
  it); reading past it raises :class:`AnswerRefused`, a named failure rather than a hub
  holding a gigabyte, or reading an endless body until the lease runs out;
* the hub asks for ``Accept-Encoding: identity`` and does not unpack an answer sent
  compressed anyway (a few kilobytes of gzip can unpack to gigabytes): reading it raises
  :class:`AnswerRefused` too; its status and headers are still the answer's;
* each request, its answer read included, ends within ``deadline`` seconds (plus one
  read timeout), however slowly the answer is dribbled out;
* redirects are never followed, and ``.netrc`` is not used: the request goes to the
  registered address and nowhere else;
* an address elsewhere is reached through the proxy the environment names
  (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``) unless ``NO_PROXY`` names it, as the
  CLI's client reaches a hub elsewhere (behind a corporate proxy it is the only way
  out); an address on this machine (:func:`backchannel.reach.loopback`) is reached
  straight, whatever the environment says (:func:`proxy_for`);
* an ``https`` address's certificate is checked against the certificates the environment
  names, as the CLI's client checks a hub's (:func:`tls_context`): the PEM bundle
  ``SSL_CERT_FILE`` names, else the directory ``SSL_CERT_DIR`` names, else certifi's
  bundle. Verification is never turned off; a certificate not trusted fails the request
  naming the host, the problem and the way out (:class:`UntrustedCertificate`).

:func:`answer_start` reads the start of an answer for an error message without reading
the rest.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from backchannel.reach import loopback

__all__ = [
    "MAX_ANSWER",
    "AnswerRefused",
    "UntrustedCertificate",
    "answer_start",
    "client",
    "proxy_for",
    "read_bounded",
    "scrub",
    "tls_context",
]

#: The most of one answer the hub reads (8 MiB).
MAX_ANSWER = 8 * 1024 * 1024


class AnswerRefused(httpx.DecodingError):
    """An answer the hub does not read to its end: larger than the bound, compressed
    though the hub asked for none, or still coming at the request's deadline."""


class UntrustedCertificate(httpx.ConnectError):
    """A service's TLS certificate the hub does not trust (or certificates the
    environment names that cannot be read): a connection failure, retried as any other
    (the fix, a variable set and the hub restarted, may come within the retries)."""


def _trusted() -> str:
    """Which certificates the hub's requests trust now, for an error message."""
    if path := os.environ.get("SSL_CERT_FILE"):
        return f"SSL_CERT_FILE={path}"
    if path := os.environ.get("SSL_CERT_DIR"):
        return f"SSL_CERT_DIR={path}"
    return "certifi's public CAs; SSL_CERT_FILE is not set"


def tls_context() -> ssl.SSLContext:
    """The certificates the hub's requests trust, chosen as httpx chooses them for the
    CLI's client: the PEM bundle ``SSL_CERT_FILE`` names, else the directory of hashed
    certificates ``SSL_CERT_DIR`` names, else certifi's bundle (either variable replaces
    certifi's CAs, as it does for the CLI and OpenSSL). Hostnames and certificates are
    always checked. Certificates the variables name that cannot be read raise
    :class:`UntrustedCertificate` naming the variable, rather than falling back to
    others."""
    what = {"cafile": "a readable PEM file", "capath": "a directory of hashed PEM files"}
    for name, option in (("SSL_CERT_FILE", "cafile"), ("SSL_CERT_DIR", "capath")):
        if path := os.environ.get(name):
            try:
                if option == "capath" and not os.path.isdir(path):
                    raise NotADirectoryError("no such directory")
                if option == "cafile":
                    return ssl.create_default_context(cafile=path)
                return ssl.create_default_context(capath=path)
            except (OSError, ssl.SSLError) as exc:
                raise UntrustedCertificate(
                    f"the certificates {name}={path} names cannot be read ({exc}); set "
                    f"{name} to {what[option]} of the CA certificates to trust, or unset it "
                    "to trust certifi's public CAs, and restart the hub"
                ) from None
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _certificate_problem(exc: BaseException) -> str | None:
    """What the TLS library said of a certificate it did not trust, when ``exc`` (or
    what it was raised from) is that; ``None`` for any other failure."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for seen in chain:  # the TLS library's own words first: "certificate has expired"
        if isinstance(seen, ssl.SSLCertVerificationError) and seen.verify_message:
            return f"certificate verify failed: {seen.verify_message}"
    return next((str(e) for e in chain if "CERTIFICATE_VERIFY_FAILED" in str(e)), None)


def _tls_peer(url: httpx.URL) -> str:
    """Whose certificate a request to ``url`` checks, for an error message: the host's,
    or an ``https`` proxy's the environment names for it (either, for an ``https``
    address through it: the TLS library does not say which handshake failed)."""
    host = f"[{url.host}]" if ":" in url.host else url.host
    where = f"{host}:{url.port or (443 if url.scheme == 'https' else 80)}"
    proxy = proxy_for(url)
    if not proxy or not proxy.startswith("https://"):
        return where
    if url.scheme != "https":
        return f"the proxy {_shown(proxy)} (named for {url.scheme} requests)"
    return f"{where} or of the proxy {_shown(proxy)} the request goes through"


class _Bounded(httpx.AsyncByteStream):
    def __init__(
        self, inner: httpx.AsyncByteStream, limit: int, encoding: str, deadline: float
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._encoding = encoding
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding:
            raise AnswerRefused(
                f"the answer is {self._encoding}-encoded though the hub asked for none "
                "(Accept-Encoding: identity); the hub does not unpack answers, which can "
                "unpack to far more than they weigh. Configure the service to answer "
                "uncompressed"
            )
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise AnswerRefused(
                    f"the answer is larger than {self._limit} bytes, the most the hub reads "
                    "of one; the rest was not read"
                )
            if time.monotonic() > self._deadline:
                raise AnswerRefused(
                    "the answer was still coming at the request's deadline; the rest was not read"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def proxy_for(url: httpx.URL) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY`` for ``http``,
    ``HTTPS_PROXY`` for ``https``, else ``ALL_PROXY``; either case), or ``None`` when
    it names none, ``NO_PROXY`` names the host, or the host is this machine."""
    if loopback(str(url)):
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy:
        return None
    host = f"{url.host}:{url.port}" if url.port else url.host
    # NO_PROXY as urllib reads it (typeshed leaves this public function out)
    if urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _shown(proxy: str) -> str:
    """``proxy`` without its password, for an error message."""
    try:
        return str(httpx.URL(proxy).copy_with(username=None, password=None))
    except (httpx.InvalidURL, TypeError, ValueError):
        return "(an address that cannot be read)"


class _BoundedTransport(httpx.AsyncBaseTransport):
    def __init__(self, limit: int, deadline: float) -> None:
        #: by proxy (None: straight), made when a request first needs it
        self._inner: dict[str | None, httpx.AsyncHTTPTransport] = {}
        self._limit = limit
        self._deadline = deadline
        #: made from the environment when a request first needs it (:func:`tls_context`)
        self._tls: ssl.SSLContext | None = None

    def _transport(self, url: httpx.URL) -> httpx.AsyncHTTPTransport:
        proxy = proxy_for(url)
        inner = self._inner.get(proxy)
        if inner is None:
            if self._tls is None:
                self._tls = tls_context()
            try:
                inner = httpx.AsyncHTTPTransport(verify=self._tls, trust_env=False, proxy=proxy)
            except (ImportError, ValueError, TypeError, httpx.InvalidURL) as exc:
                raise httpx.ProxyError(
                    f"the proxy the environment names for {url.scheme} requests "
                    f"({_shown(proxy or '')}) cannot be used: {exc}; fix HTTP_PROXY / "
                    f"HTTPS_PROXY / ALL_PROXY, or name {url.host} in NO_PROXY to reach it "
                    "straight"
                ) from None
            self._inner[proxy] = inner
        return inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ends = time.monotonic() + self._deadline
        try:
            resp = await self._transport(request.url).handle_async_request(request)
        except httpx.ConnectError as exc:
            if isinstance(exc, UntrustedCertificate) or (why := _certificate_problem(exc)) is None:
                raise
            raise UntrustedCertificate(
                f"the TLS certificate of {_tls_peer(request.url)} is not trusted by this hub "
                f"({why}; trusted: "
                f"{_trusted()}); if it is signed by a CA of your own (a private CA, or a "
                "TLS-inspecting proxy's), set SSL_CERT_FILE in the hub's environment to a PEM "
                "bundle holding that CA (and the public CAs the hub's other services need) "
                "and restart the hub; or register the service by the name its certificate "
                "is for",
                request=request,
            ) from exc
        encoding = resp.headers.get("content-encoding", "").strip().lower()
        assert isinstance(resp.stream, httpx.AsyncByteStream)
        resp.stream = _Bounded(
            resp.stream, self._limit, "" if encoding in ("", "identity") else encoding, ends
        )
        return resp

    async def aclose(self) -> None:
        inner, self._inner = list(self._inner.values()), {}
        for transport in inner:
            await transport.aclose()


def client(
    *, deadline: float, limit: int = MAX_ANSWER, headers: dict[str, str] | None = None, **kw: Any
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for registered services (see the module docstring):
    each request within ``deadline`` seconds, each answer at most ``limit`` bytes."""
    return httpx.AsyncClient(
        transport=_BoundedTransport(limit, deadline),
        follow_redirects=False,
        trust_env=False,
        headers={"Accept-Encoding": "identity", **(headers or {})},
        **kw,
    )


async def read_bounded(resp: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of the start of a streamed answer, reading no further."""
    got = bytearray()
    async for chunk in resp.aiter_raw():
        got += chunk
        if len(got) >= limit:
            break
    return bytes(got[:limit])


async def answer_start(resp: httpx.Response, chars: int = 200) -> str:
    """The first ``chars`` characters of a streamed answer for an error message (or
    what kept the hub from reading them), reading no more of it than that."""
    try:
        raw = await read_bounded(resp, chars * 4)
    except AnswerRefused as exc:
        return f"({exc})"
    except httpx.HTTPError as exc:
        return f"(the answer could not be read: {type(exc).__name__})"
    return raw.decode("utf-8", errors="replace")[:chars].strip()


def scrub(text: str, url: str, *secrets: str | None) -> str:
    """``text`` without the password of ``url`` (a registered service's) nor any of
    ``secrets`` (its token): what goes into a dead letter's reason or a log line."""
    password = urlsplit(url).password
    for secret in (password, password and unquote(password), *secrets):
        if secret:
            text = text.replace(secret, "***")
    return text
