"""Serving an ASGI app on a loopback port in a thread: how ``akadze bench dashboard``
and the dashboard's browser tests run the dashboard (without the CLI: this module
imports nothing of akadze)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving(asgi: Any) -> Iterator[str]:
    """An ASGI app served by uvicorn on a loopback port, in a thread; yields its base
    URL. The socket listens before the thread starts, so a first request waits in its
    backlog instead of being refused (the browser tests serve the dashboard this way)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    if thread.is_alive():
        raise RuntimeError("the dashboard server did not stop within 30 s")
