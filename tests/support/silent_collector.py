"""A collector that accepts connections on 127.0.0.1 and never answers: no HTTP/2 handshake, no HTTP response.

What a hung collector, a black-holing proxy or a full backlog looks like to an exporter: the connection is made, and
then nothing. There is no real part that behaves so on purpose; this is the smallest server that does (a listening
socket whose connections are accepted, held open and never read from or written to).
"""

from __future__ import annotations

import selectors
import socket
import threading


class SilentCollector:
    """``with SilentCollector() as c: c.endpoint`` -- accepted connections are kept open until :meth:`stop`."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-collector", daemon=True)
        self.accepted = 0

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                for _key, _mask in selector.select(timeout=0.1):
                    try:
                        conn, _addr = self._listener.accept()
                    except OSError:
                        continue
                    self._held.append(conn)
                    self.accepted += 1

    def __enter__(self) -> SilentCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._listener.close()
