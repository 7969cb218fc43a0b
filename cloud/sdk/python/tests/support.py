"""What the suites share: the clouds `tests/tests/sdks.rs` started, unique
names, and a local peer that stands between the client and a cloud to
see what was sent and to lose answers on purpose."""

import os
import socket
import socketserver
import threading
import unittest
import uuid
from typing import Dict, List, Optional, Sequence, Tuple, Union

import opgraph


def setting(name: str) -> str:
    """An environment variable the harness sets. Missing is a failure, not
    a skip: a suite that silently tests nothing looks like one that passed."""
    value = os.environ.get(name)
    if not value:
        raise AssertionError(
            f"{name} is not set: run this suite through `cargo test -p opgraph-tests "
            "--test sdks -- python`, which starts the clouds"
        )
    return value


def client(**settings: object) -> opgraph.Client:
    """A client of the normal cloud with its admin key."""
    settings.setdefault("url", setting("OPGRAPH_URL"))
    settings.setdefault("api_key", setting("OPGRAPH_API_KEY"))
    return opgraph.Client(**settings)  # type: ignore[arg-type]


def limited_client(**settings: object) -> opgraph.Client:
    """A client of the cloud limited to one request per second."""
    settings.setdefault("url", setting("OPGRAPH_LIMITED_URL"))
    settings.setdefault("api_key", setting("OPGRAPH_LIMITED_API_KEY"))
    return opgraph.Client(**settings)  # type: ignore[arg-type]


def unique(what: str) -> str:
    """A name no other test (or earlier run) uses, so that each test sees
    only its own events in a shared cloud."""
    return f"sdk.python.{what}.{uuid.uuid4().hex[:12]}"


def closed_port() -> int:
    """A loopback port nothing listens on (just freed by the OS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """A loopback TCP peer that records each HTTP request it gets, then:

    - with ``upstream``, relays it to that cloud and the answer back,
      except that the first ``lose`` answers are read from the cloud and
      dropped (the connection closes unanswered), as when a network loses
      an answer after the cloud acted;
    - with ``answer``, sends those raw bytes back; given a list, the n-th
      request gets its n-th item (the last one repeats), and ``None``
      closes the connection unanswered;
    - with neither, closes the connection unanswered.

    Use as a context manager; ``url`` is its base URL.
    """

    def __init__(
        self,
        upstream: Optional[str] = None,
        lose: int = 0,
        answer: Union[None, bytes, Sequence[Optional[bytes]]] = None,
    ) -> None:
        self.requests: List[Dict[str, str]] = []
        self._lock = threading.Lock()
        self._lose = lose
        self._answers: Sequence[Optional[bytes]] = (
            [answer] if answer is None or isinstance(answer, bytes) else list(answer)
        )
        self._upstream = None
        if upstream is not None:
            host, port = upstream.split("://", 1)[1].rstrip("/").rsplit(":", 1)
            self._upstream = (host, int(port))
        peer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                peer._serve(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll, because shutdown() waits for the next one.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> "Peer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, conn: socket.socket) -> None:
        raw, headers = _read_request(conn)
        with self._lock:
            self.requests.append(headers)
            losing = self._lose > 0
            self._lose -= 1
            answer = self._answers[min(len(self.requests), len(self._answers)) - 1]
        if self._upstream is not None:
            with socket.create_connection(self._upstream, timeout=30) as up:
                up.sendall(raw)
                answer = _read_all(up)
            if not losing:
                conn.sendall(answer)
        elif answer is not None:
            conn.sendall(answer)


def _read_request(conn: socket.socket) -> Tuple[bytes, Dict[str, str]]:
    """One request, whole: head, then as many body bytes as it declares."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {":request": lines[0]}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    headers[":body"] = body.decode("utf-8", "replace")
    return head + b"\r\n\r\n" + body, headers


def _read_all(conn: socket.socket) -> bytes:
    # The client sends `Connection: close`, so the cloud closes after its
    # answer: reading to the end reads exactly one answer.
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def http_answer(status: str, body: bytes, headers: Optional[Dict[str, str]] = None) -> bytes:
    """The raw bytes of an HTTP/1.1 answer, for a :class:`Peer`."""
    lines = ["HTTP/1.1 " + status, f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class CloudTest(unittest.TestCase):
    """A test against the normal cloud, with ``self.client`` ready."""

    def setUp(self) -> None:
        self.client = client()
