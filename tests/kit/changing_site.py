"""A local site that changes on a clock the test controls: a news index and its articles.

``/`` links to every article published so far (``/a/<n>``); each article
links to the index and to its neighbours. :meth:`ChangingSite.publish`
adds articles, :meth:`ChangingSite.edit` changes one's text. Every GET is
recorded with its time (:meth:`ChangingSite.fetches`), so a test can say
which pages a run fetched and when each was last fetched before.
Served on 127.0.0.1 from a thread (http.server), stopped by :meth:`stop`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class ChangingSite:
    def __init__(self, articles: int = 10) -> None:
        self._lock = threading.Lock()
        self._articles = articles
        self._versions: dict[int, int] = defaultdict(int)
        self._fetches: list[tuple[float, str]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = site._page(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = "http://127.0.0.1:%d/" % self.port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="changing-site")

    def start(self) -> ChangingSite:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> ChangingSite:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- the clock ------------------------------------------------------------------

    def publish(self, count: int = 1) -> list[str]:
        """Add ``count`` articles (linked from the index from now on); their URLs."""
        with self._lock:
            first, self._articles = self._articles, self._articles + count
        return [self.article_url(n) for n in range(first, first + count)]

    def edit(self, n: int) -> None:
        with self._lock:
            self._versions[n] += 1

    # -- what was fetched -----------------------------------------------------------

    def article_url(self, n: int) -> str:
        return "%sa/%d" % (self.url, n)

    def urls(self) -> list[str]:
        """The index and every article published so far."""
        with self._lock:
            count = self._articles
        return [self.url] + [self.article_url(n) for n in range(count)]

    def fetches(self, since: float = 0.0) -> list[tuple[float, str]]:
        """(time.time(), URL) of each GET at or after ``since``."""
        with self._lock:
            return [(t, url) for t, url in self._fetches if t >= since]

    def fetched(self, since: float = 0.0) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for _, url in self.fetches(since):
            counts[url] += 1
        return dict(counts)

    def _page(self, path: str) -> tuple[int, str]:
        with self._lock:
            self._fetches.append((time.time(), self.url + path.lstrip("/")))
            count = self._articles
            if path == "/":
                links = "".join('<a href="/a/%d">article %d</a>\n' % (n, n)
                                for n in range(count))
                return 200, "<html><body><h1>index</h1>\n%s</body></html>" % links
            if path.startswith("/a/") and path[3:].isdigit() and int(path[3:]) < count:
                n = int(path[3:])
                near = "".join('<a href="/a/%d">next</a>' % m for m in (n + 1,) if m < count)
                return 200, ("<html><body><h1>article %d</h1><p>version %d</p>"
                             '<a href="/">index</a>%s</body></html>'
                             % (n, self._versions[n], near))
            return 404, "<html><body>not found</body></html>"
