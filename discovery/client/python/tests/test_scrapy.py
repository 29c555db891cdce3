"""A real Scrapy crawl through the fleet, by leases and through the gateway, of a site
that bans one of the proxies: the crawl goes on through the others, and discovery shows
the ban."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import resting_for

pytest.importorskip("scrapy")

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


@pytest.mark.parametrize("mode,host,tls", [
    ("leases", "127.0.0.1", False),
    ("leases", "127.0.0.5", True),
    ("gateway", "127.0.0.2", True),
    ("gateway", "127.0.0.4", False),
])
def test_crawl_goes_on_when_a_site_bans_a_proxy(client, stack, make_site, mode, host, tls):
    site = make_site(host, ban_first=True, tls=tls)
    settings = {"PROXYFLEET_URL": stack["url"], "PROXYFLEET_TOKEN": stack["token"],
                "PROXYFLEET_SELECTOR": stack["selector"]}
    if mode == "gateway":
        settings["PROXYFLEET_GATEWAY"] = stack["gateway"]
    result, log = crawl(site.url, 20, settings)

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
    # Discovery shows the ban: exactly the proxy the site saw first rests for it.
    resting = resting_for(client, stack["selector"], site.host)
    assert len(resting) == 1, resting
