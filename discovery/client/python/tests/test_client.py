import urllib.request

import pytest

from conftest import resting_for
from proxyfleet import Client, NoProxy, ProxyfleetError


def fetch(url, proxy_url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    with opener.open(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_lease_renew_report_release(client, stack, make_site):
    site = make_site("127.0.0.3")
    lease = client.acquire(stack["selector"], target=site.host, ttl=60, wait=30)
    assert "@" in lease.proxy_url, "the lease's proxy URL carries its credentials"
    assert lease.proxy["password"] not in repr(lease), "a lease never prints its credentials"

    status, body = fetch(site.url + "/through-a-lease", lease.proxy_url)
    assert status == 200 and "/through-a-lease" in body
    assert site.seen[-1][0].startswith("127.88."), "the request left from the proxy's own address"

    renewed = client.renew(lease.id, 120)
    assert renewed.id == lease.id and renewed.proxy_url == lease.proxy_url and renewed.ttl == 120

    client.report(lease.id, "banned")
    assert resting_for(client, stack["selector"], site.host) == [lease.proxy_id]
    client.release(lease.id)
    listed = {f"{p['namespace']}/{p['name']}": p for p in client.list_proxies(stack["selector"])}
    assert listed[lease.proxy_id]["activeLeases"] == 0

    # The proxy rests for the site: the next lease for it is another proxy.
    other = client.acquire(stack["selector"], target=site.host, ttl=60, wait=30)
    assert other.proxy_id != lease.proxy_id
    client.release(other.id)


def test_session_report(client, stack, make_site):
    site = make_site("127.0.0.3")
    first = client.acquire(stack["selector"], target="session." + site.host, session="basket-1", wait=30)
    client.release(first.id)
    again = client.acquire(stack["selector"], target="session." + site.host, session="basket-1", wait=30)
    assert again.proxy_id == first.proxy_id, "a session keeps its proxy"
    client.report_session("basket-1", "banned")
    client.release(again.id)
    moved = client.acquire(stack["selector"], target="session." + site.host, session="basket-1", wait=30)
    assert moved.proxy_id != first.proxy_id, "after a ban the session moves"
    client.release(moved.id)


def test_errors_are_typed(client, stack):
    with pytest.raises(NoProxy) as e:
        client.acquire({"run": "nobody-has-this"})
    assert e.value.status == 409 and e.value.code == "no_match" and e.value.body["considered"] == 0
    with pytest.raises(ProxyfleetError) as e:
        Client(stack["url"], "not-the-token-0123456789").acquire(stack["selector"])
    assert e.value.status == 401 and e.value.code == "unauthorized"
    with pytest.raises(ProxyfleetError) as e:
        client.report_session("never-used", "banned")
    assert e.value.status == 404 and e.value.code == "unknown_session"
    with pytest.raises(ValueError):
        client.report("x", "blocked")


def test_held_lease_is_released(client, stack):
    with client.held(stack["selector"], target="held.example", ttl=60) as held:
        proxy = held.lease.proxy_id
        listed = {f"{p['namespace']}/{p['name']}": p for p in client.list_proxies(stack["selector"])}
        assert listed[proxy]["activeLeases"] >= 1
    listed = {f"{p['namespace']}/{p['name']}": p for p in client.list_proxies(stack["selector"])}
    assert listed[proxy]["activeLeases"] == 0
