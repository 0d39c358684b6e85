"""Dataset test helpers: a local HTTP mirror on 127.0.0.1 (in a thread) and a URL nothing listens on."""
import functools
import http.server
import os
import socket
import threading

import pytest


class Mirror:
    """A directory served over HTTP; `paths` records every request, `url` ends with '/'."""

    def __init__(self, directory):
        self.directory = str(directory)
        self.paths = []
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                mirror.paths.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      functools.partial(Handler, directory=self.directory))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def serve(monkeypatch):
    """serve(directory) -> Mirror; every server is shut down after the test. Proxies are bypassed for 127.0.0.1."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    mirrors = []

    def start(directory):
        os.makedirs(directory, exist_ok=True)
        mirrors.append(Mirror(directory))
        return mirrors[-1]

    yield start
    for m in mirrors:
        m.close()


@pytest.fixture
def unreachable_url():
    """http://127.0.0.1:PORT/ for a port that was just free: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"
