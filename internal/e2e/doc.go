// Package e2e holds what the end-to-end tests share; the tests live in its sub-packages,
// one per group of what they cover. Each group runs the whole system on real parts: its
// TestMain starts a Temporal dev server and a kube-apiserver with the CRD, and its tests
// start the controller, a worker and real forward proxies on loopback (internal/stack,
// internal/testenv). They check that the system works; what it costs and how fast it goes
// is measured on the same parts by internal/benchmarks.
//
// The groups, their files (internal/e2e/<group>/<file>_test.go, with main_test.go for
// TestMain) and what they cover:
//
//	group          files                      what it covers
//	life           provision, paths           a Proxy from apply to delete: provisioned,
//	                                          replaced make-before-break on an edit or a
//	                                          signal, deleted while coming up; workflows
//	                                          driven through reports, bans, maxAge, a
//	                                          quota wait, a permanent failure,
//	                                          continue-as-new
//	health         health, shards             verdicts: a killed instance is detected and
//	                                          recreated, an External proxy follows its
//	                                          endpoint; monitor shards are started,
//	                                          restarted, and converge in a rollout of
//	                                          --monitor-shards
//	discovery      leases, refresh, python    crawlers lease, fetch and report bans; an
//	                                          unhealthy proxy stops being offered; the
//	                                          incremental pass reads only what changed;
//	                                          the Python client and Scrapy, by leases and
//	                                          through the gateway
//	recovery       crash, terminated          the worker killed -9 mid-create (nothing
//	                                          duplicated or leaked); a run terminated by
//	                                          hand leaves discovery at once, is restarted
//	                                          by the controller and adopts its instance
//	gc             gc                         the proxy-gc schedule deletes exactly this
//	                                          installation's orphans
//	observability  metrics, tracing           each binary's /metrics (documented series,
//	                                          promlint, the dashboard's and alerts' names);
//	                                          one trace from the controller to the
//	                                          activities
//	security       credentials, cloudinit,    passwords and cloud-init canaries stay out
//	               deputy                     of histories, memos, logs and spans;
//	                                          External credentials need the label; the
//	                                          worker refuses namespaces and images off its
//	                                          allowlist
//	aws            aws, errors, secrets       aws Proxies against the fake EC2 API, whose
//	                                          instances boot their user data into real
//	                                          Squid: created once and hardened, a Spot
//	                                          interruption replaced, deleted, swept;
//	                                          throttling, capacity, a missing image, a
//	                                          lost answer; canaries out of history and logs
//
// Each group is a package of its own, so `go test ./internal/e2e/...` starts one pair of
// servers per group and runs two groups at once: on a 2-core machine that costs about 6%
// more wall time than one package did, for about 85% more CPU. This package holds the
// helpers more than one group uses: RecordHistory (histories.go: the replay corpus, with
// RECORD_HISTORIES=1), Crawler (crawler.go: the Go client scoped to a test's proxies) and
// Traced (tracing.go: spans recorded in memory).
package e2e
