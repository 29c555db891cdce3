"""Runs one Scrapy crawl with proxyfleet's middleware and prints what it got as JSON.

Usage: python3 crawl.py '<json: base, pages, settings>'. A process of its own per crawl:
Twisted's reactor cannot be started twice in one.
"""

import json
import sys

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess


class Pages(scrapy.Spider):
    name = "pages"

    def __init__(self, base, pages, **kwargs):
        super().__init__(**kwargs)
        self.base, self.pages = base, int(pages)

    def start_requests(self):
        for i in range(self.pages):
            yield scrapy.Request(f"{self.base}/page/{i}", callback=self.parse)

    def parse(self, response):
        proxy = response.headers.get("Proxyfleet-Proxy")
        yield {"url": response.url, "status": response.status, "proxy": proxy.decode() if proxy else None}


def main():
    spec = json.loads(sys.argv[1])
    settings = {
        "DOWNLOADER_MIDDLEWARES": {"proxyfleet.scrapy.ProxyfleetMiddleware": 740},
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
        "CONCURRENT_REQUESTS": 8,
    }
    settings.update(spec["settings"])
    items = []
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(Pages)

    def collect(item, **_):
        items.append(dict(item))

    # Signals hold their receivers weakly: collect lives as long as main.
    crawler.signals.connect(collect, signal=signals.item_scraped)
    process.crawl(crawler, base=spec["base"], pages=spec["pages"])
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, float, str))}
    print(json.dumps({"items": items, "stats": stats}))


if __name__ == "__main__":
    main()
