"""Client.acquire(wait=…) against a stand-in for discovery's lease route: the wait goes to
discovery as waitSeconds, and the request's timeout covers it. Runs without a stack."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from proxyfleet import Client, NoProxy

LEASE = {"leaseID": "l1", "proxy": {"name": "p", "namespace": "crawl", "url": "http://10.0.0.1:3128",
                                    "ip": "10.0.0.1", "port": 3128},
         "expiresAt": "2030-01-01T00:00:00Z", "ttlSeconds": 300}


@pytest.fixture
def discovery():
    """A fake discovery: POST /v1/leases records the body and answers after ``delay``
    seconds (discovery's wait) with ``status``."""
    state = {"bodies": [], "status": 201, "answered": threading.Event(), "release": threading.Event()}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["bodies"].append(body)
            # Discovery answers once its wait is over: here, once the test says so.
            state["release"].wait(timeout=30)
            if state["status"] == 201:
                out, code = LEASE, 201
            else:
                out, code = {"error": "no_match", "message": "none", "considered": 0}, 409
            raw = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}"
    yield state
    state["release"].set()
    srv.shutdown()
    srv.server_close()


def test_wait_is_sent_and_the_timeout_covers_it(discovery):
    # A timeout shorter than the time discovery takes to answer: the wait extends it.
    client = Client(discovery["url"], "token-0123456789abcdef", timeout=0.2)
    result = {}

    def acquire():
        try:
            result["lease"] = client.acquire({"pool": "p"}, wait=30)
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    t = threading.Thread(target=acquire)
    t.start()
    # Answer well after the client's own timeout (0.2 s) would have cut the request off.
    assert not t.join(timeout=1.0) and t.is_alive()
    discovery["release"].set()
    t.join(timeout=10)
    assert "error" not in result, result.get("error")
    assert result["lease"].id == "l1"
    assert discovery["bodies"] == [{"selector": {"pool": "p"}, "waitSeconds": 30}]


def test_wait_is_capped_and_absent_without_one(discovery):
    discovery["release"].set()
    client = Client(discovery["url"], "token-0123456789abcdef", max_wait=10)
    client.acquire(wait=120)
    client.acquire()
    assert discovery["bodies"] == [{"waitSeconds": 10}, {}]


def test_no_proxy_after_the_wait(discovery):
    discovery["release"].set()
    discovery["status"] = 409
    client = Client(discovery["url"], "token-0123456789abcdef", sleep=lambda s: pytest.fail("no Retry-After: no retry"))
    with pytest.raises(NoProxy):
        client.acquire(wait=5)
    assert discovery["bodies"] == [{"waitSeconds": 5}]
