"""Fixtures for tests against a running proxyfleet: discovery (API and gateway) and a fleet
of local proxies, each leaving from a loopback address of its own.

The Go test internal/e2e TestPythonClientAndScrapy starts the real stack and runs these
tests with PROXYFLEET_TEST_URL, PROXYFLEET_TEST_TOKEN, PROXYFLEET_TEST_GATEWAY and
PROXYFLEET_TEST_SELECTOR (JSON) set. Without them every test is skipped.
"""

import json
import os
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from proxyfleet import Client


@pytest.fixture(scope="session")
def stack():
    url = os.environ.get("PROXYFLEET_TEST_URL")
    if not url:
        pytest.skip("no proxyfleet to test against: run through `go test ./internal/e2e -run TestPythonClientAndScrapy`")
    return {
        "url": url,
        "token": os.environ["PROXYFLEET_TEST_TOKEN"],
        "gateway": os.environ["PROXYFLEET_TEST_GATEWAY"],
        "selector": json.loads(os.environ.get("PROXYFLEET_TEST_SELECTOR", "{}")),
    }


@pytest.fixture
def client(stack):
    return Client(stack["url"], stack["token"])


class Site:
    """A site on a loopback address that records who fetched what, and answers 403 to
    the first address that visits it when it bans one: a site that took a dislike to one
    proxy of the fleet."""

    def __init__(self, host, ban_first, tls_dir=None):
        self.seen = []
        self.banned = None
        self.ban_first = ban_first
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                peer = self.client_address[0]
                with site.lock:
                    if site.ban_first and site.banned is None:
                        site.banned = peer
                    banned = peer == site.banned
                    site.seen.append((peer, self.path, 403 if banned else 200))
                body = b"banned\n" if banned else f"page {self.path} for {peer}\n".encode()
                self.send_response(403 if banned else 200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        scheme = "http"
        if tls_dir is not None:
            cert, key = tls_dir / "cert.pem", tls_dir / "key.pem"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", f"/CN={host}", "-addext", f"subjectAltName=IP:{host}",
                            "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(cert), str(key))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.host = host
        self.url = f"{scheme}://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def make_site(tmp_path):
    sites = []

    def make(host, ban_first=False, tls=False):
        site = Site(host, ban_first, tmp_path if tls else None)
        sites.append(site)
        return site

    yield make
    for s in sites:
        s.close()


def resting_for(client, selector, target):
    """The proxies (namespace/name) of the selector that rest for target now."""
    return sorted(f"{p['namespace']}/{p['name']}" for p in client.list_proxies(selector)
                  if target in p.get("cooldowns", {}))


def ipv6_request(url, **kwargs):
    """A Scrapy request for an IPv6 literal URL with its brackets, as Scrapy makes it with a
    w3lib that keeps them. Debian's (2.1.1) drops them, and with them the host (Scrapy
    sends http://::1:8080/ then), so the URL is put back as given."""
    from scrapy import Request

    req = Request(url, **kwargs)
    req._url = url
    return req
