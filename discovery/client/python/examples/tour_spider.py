"""The README tour's spider: six pages through the dev stack's gateway, each answer
naming the fleet proxy that carried it.

    PYTHONPATH=discovery/client/python PROXYFLEET_TOKEN=<token> \\
        /usr/bin/python3 -m scrapy runspider discovery/client/python/examples/tour_spider.py

The local proxies reach loopback only, so the pages are the local proxy host's /healthz.
Set PROXYFLEET_GATEWAY to empty to lease proxies from the API instead of the gateway.
"""

import os

import scrapy


class TourSpider(scrapy.Spider):
    name = "tour"
    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {"proxyfleet.scrapy.ProxyfleetMiddleware": 740},
        "PROXYFLEET_URL": os.environ.get("PROXYFLEET_URL", "http://127.0.0.1:8090"),
        "PROXYFLEET_GATEWAY": os.environ.get("PROXYFLEET_GATEWAY", "127.0.0.1:8091"),
        "PROXYFLEET_TOKEN": os.environ.get("PROXYFLEET_TOKEN", ""),
        "PROXYFLEET_SELECTOR": {"region": "local"},
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
        "LOG_LEVEL": "WARNING",
        "CONCURRENT_REQUESTS": 1,
    }

    def start_requests(self):
        for i in range(6):
            # One site: the gateway picks a proxy per request, so its pages spread over
            # the fleet.
            yield scrapy.Request(f"http://127.0.0.1:8089/healthz?page={i}", callback=self.parse)

    def parse(self, response):
        proxy = response.headers.get("Proxyfleet-Proxy", b"(leased)").decode()
        print(f"page {response.url.rsplit('=', 1)[1]}: {response.status} via {proxy}", flush=True)
        yield {"url": response.url, "status": response.status, "proxy": proxy}
