"""Real Scrapy crawls through the fleet, by leases and through the gateway: of a site that
bans one of the proxies (the crawl goes on through the others, and discovery shows the
ban), and of one site over the whole fleet (its requests spread over every proxy)."""

import base64
import collections
import http.client
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ipv6_request, resting_for

pytest.importorskip("scrapy")

from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

from proxyfleet.scrapy import ProxyfleetMiddleware  # noqa: E402

HERE = pathlib.Path(__file__).parent


def crawl(base, pages, settings):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    # Scrapy must not send the crawl through a proxy of the environment's.
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, str(HERE / "crawl.py"), json.dumps({"base": base, "pages": pages, "settings": settings})],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip(), out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def settings_for(stack, mode, per=None):
    settings = {"PROXYFLEET_URL": stack["url"], "PROXYFLEET_TOKEN": stack["token"],
                "PROXYFLEET_SELECTOR": stack["selector"]}
    if mode == "gateway":
        settings["PROXYFLEET_GATEWAY"] = stack["gateway"]
    if per is not None:
        settings["PROXYFLEET_LEASE_PER"] = per
    return settings


@pytest.mark.parametrize("mode,host,tls,per", [
    ("leases", "127.0.0.1", False, None),
    ("leases", "127.0.0.5", True, None),
    ("leases", "127.0.0.7", False, "slot"),
    ("gateway", "127.0.0.2", True, "slot"),
    ("gateway", "127.0.0.8", True, None),
    ("gateway", "127.0.0.4", False, None),
])
def test_crawl_goes_on_when_a_site_bans_a_proxy(client, stack, make_site, mode, host, tls, per):
    site = make_site(host, ban_first=True, tls=tls)
    result, log = crawl(site.url, 20, settings_for(stack, mode, per))

    pages = sorted(i["url"].rsplit("/", 1)[1] for i in result["items"])
    assert pages == sorted(str(i) for i in range(20)), f"every page is crawled\n{log[-3000:]}"
    assert all(i["status"] == 200 for i in result["items"])
    assert site.banned is not None
    refused = [s for s in site.seen if s[2] == 403]
    assert refused, "the site banned a proxy"
    assert all(s[0] != site.banned for s in site.seen if s[2] == 200), "no page came from the banned proxy"
    assert result["stats"].get("proxyfleet/ban_retries", 0) >= 1
    if mode == "gateway" and not tls:
        # Plain HTTP through the gateway: the gateway saw the 403 and reported it itself.
        assert all(i["proxy"] for i in result["items"]), "the gateway names the proxy of each answer"
    if mode == "gateway" and tls and per is None:
        # Without a session nothing names the proxy that carried a tunnel (the gateway
        # chose it, inside it the gateway sees nothing): the ban cannot be reported, only
        # sent again, and the gateway's rotation takes another proxy.
        return
    # Discovery shows the ban: exactly the proxy the site saw first rests for it.
    resting = resting_for(client, stack["selector"], site.host)
    assert len(resting) == 1, resting


@pytest.mark.parametrize("mode,host,tls", [
    ("leases", "127.0.0.9", False),
    ("leases", "127.0.0.10", True),
    ("gateway", "127.0.0.11", False),
    ("gateway", "127.0.0.12", True),
])
def test_one_site_spreads_over_the_fleet(client, stack, make_site, mode, host, tls):
    """With the middleware's defaults, a crawl of one site at concurrency 8 over 8 proxies
    goes through every proxy, none carrying more than twice its share."""
    fleet = client.list_proxies(stack["selector"], healthy=True)
    assert len(fleet) == 8, "the Go test starts eight proxies"
    site = make_site(host, tls=tls)
    pages = 120
    result, log = crawl(site.url, pages, settings_for(stack, mode))  # CONCURRENT_REQUESTS 8

    assert len(result["items"]) == pages, log[-3000:]
    by_proxy = collections.Counter(peer for peer, _, _ in site.seen)
    print(f"{mode} {'https' if tls else 'http'}: requests per proxy {sorted(by_proxy.values())}")
    share = pages / len(fleet)
    assert max(by_proxy.values()) <= 2 * share, f"one site's requests spread over the fleet: {dict(by_proxy)}"
    assert len(by_proxy) == len(fleet), f"every proxy carried some: {dict(by_proxy)}"
    if mode == "leases":
        listed = client.list_proxies(stack["selector"])
        assert sum(p["activeLeases"] for p in listed) == 0, "every lease of the crawl was released"


def test_a_crawl_wider_than_the_fleet_waits_for_slots(client, stack, make_site):
    """Concurrency over the fleet's slots (8 proxies of maxLeases 4: 32): the requests
    beyond them wait for a lease the crawl's own answers free, and every page comes."""
    site = make_site("127.0.0.14")
    settings = dict(settings_for(stack, "leases"), CONCURRENT_REQUESTS=48, CONCURRENT_REQUESTS_PER_DOMAIN=48)
    result, log = crawl(site.url, 200, settings)
    assert len(result["items"]) == 200, log[-3000:]
    listed = client.list_proxies(stack["selector"])
    assert sum(p["activeLeases"] for p in listed) == 0, "every lease of the crawl was released"


def test_sticky_leases_keep_one_proxy(client, stack, make_site):
    """PROXYFLEET_LEASE_PER = "slot" (the former default) keeps a slot's requests on one
    lease, and so one proxy."""
    site = make_site("127.0.0.13")
    result, log = crawl(site.url, 40, settings_for(stack, "leases", "slot"))
    assert len(result["items"]) == 40, log[-3000:]
    assert len({peer for peer, _, _ in site.seen}) == 1, site.seen
    assert result["stats"].get("proxyfleet/leases") == 1


def test_gateway_takes_the_credentials_built_for_an_ipv6_site(stack):
    """A session named after an IPv6 host must not put its ':' in the username: the Basic
    credentials would end the username there and the gateway would answer 407. The gateway
    authenticates before it leases, so what it answers after (the local fleet proxies leave
    from IPv4 addresses and cannot reach [::1]: a 502) shows the credentials were taken."""
    mw = ProxyfleetMiddleware(Settings(settings_for(stack, "gateway", "slot")))
    req = ipv6_request("http://[::1]:9/page")
    assert mw.process_request(req, None) is None
    HttpProxyMiddleware().process_request(req, None)
    host, port = stack["gateway"].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", req.url, headers={"Proxy-Authorization": req.headers[b"Proxy-Authorization"].decode()})
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    user = base64.b64decode(req.headers[b"Proxy-Authorization"].split()[1]).decode().split(":", 1)[0]
    assert "session=" in user, user
    assert resp.status != 407 and resp.getheader("Proxyfleet-Error") != "proxy_auth_required", (resp.status, user)
