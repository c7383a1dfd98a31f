"""Stand-in HTTP peers of the tests (a callback service, a model API, a proxy): a
request handler served on 127.0.0.1 on a thread of its own."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that leaves the tests' output alone (no line a request, no traceback
    when the client hung up before its answer was written: a timeout under test)."""

    def log_message(self, *args: Any) -> None:
        pass

    def handle(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()


class Peer:
    """Serves a handler class: :meth:`serve` starts it, :attr:`url` is where, :meth:`close`
    stops it."""

    server: ThreadingHTTPServer
    url: str

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Flood(Peer):
    """A service whose every answer (to a GET or a POST) is ``status`` with ``headers``
    and then ``body``, or, with ``endless``, chunks of 64 KiB until the client goes away:
    what a service that answers a gigabyte, or never ends its answer, looks like to the
    hub. :attr:`requests` holds the path and headers of each request; :attr:`sent` how
    many body bytes went out."""

    def __init__(
        self,
        status: int,
        *,
        body: bytes = b"",
        endless: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.sent = 0
        self.lock = threading.Lock()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                if size:
                    self.rfile.read(size)
                with peer.lock:
                    peer.requests.append((self.path, dict(self.headers.items())))
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if not endless:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 65536
                framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
                try:
                    while True:
                        self.wfile.write(framed)
                        with peer.lock:
                            peer.sent += len(chunk)
                except OSError:
                    self.close_connection = True  # the client gave up: what it should do

            do_GET = do_POST = answer

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except OSError:  # the client closed the connection it kept alive
                    self.close_connection = True

        self.serve(Handler)
