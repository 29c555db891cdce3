// What it takes to provision a fleet of 200 on the test stack: BenchmarkProvision200
// applies 200 local Proxies at once and reports the time until all are Ready and the
// history events each Proxy's workflow wrote on the way. Feeds the first two rows of the
// Provisioning table of docs/benchmarks.md (## Provisioning).

package benchmarks

import (
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/stack"
)

// BenchmarkProvision200 applies 200 local Proxies (16 creates in flight) and reports the time
// until all are Provisioned (and Ready), and the history events each workflow used to get
// there.
//
//	go test ./internal/benchmarks -run '^$' -bench Provision200 -benchtime 1x
func BenchmarkProvision200(b *testing.B) {
	const n = 200
	s := stack.Start(b, stack.Options{})
	for b.Loop() {
		ns := s.Namespace(b)
		start := time.Now()
		names := applyFleet(b, s, ns, "bench", n, nil)
		applied := time.Since(start)
		waitAllReady(b, s, ns, n, 5*time.Minute)
		all := time.Since(start)
		events := fleetHistory(b, s, ns, names)
		b.ReportMetric(all.Seconds(), "s-until-all-ready")
		b.ReportMetric(applied.Seconds(), "s-to-apply")
		b.ReportMetric(float64(n)/all.Seconds(), "proxies-ready/s")
		b.ReportMetric(float64(events)/n, "history-events/proxy")
	}
}
