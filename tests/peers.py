"""Stand-in HTTP peers of the tests (a callback service, a model API, a proxy): a
request handler served on 127.0.0.1 on a thread of its own."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that leaves the tests' output alone (no line a request)."""

    def log_message(self, *args: Any) -> None:
        pass


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
