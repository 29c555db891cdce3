package probe_test

import (
	"context"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
)

// BenchmarkProbe measures how many probes per second one process sustains through a real
// forward proxy to a loopback target (proxy and target share the machine, so this is a
// lower bound for a worker whose proxies run elsewhere).
//
//	go test ./activities/probe -run '^$' -bench Probe -cpu 2
func BenchmarkProbe(b *testing.B) {
	httpURL, httpsURL, _, trust, _ := servers(b)
	proxy := forwardProxyB(b)
	for _, tc := range []struct {
		name string
		req  probe.Request
	}{
		{"http", probe.Request{Proxy: proxy, URL: httpURL, Timeout: 5 * time.Second, Credentials: creds}},
		{"https-connect", probe.Request{Proxy: proxy, URL: httpsURL, Timeout: 5 * time.Second, TLSConfig: trust, Credentials: creds}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetParallelism(32)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if res := probe.Probe(context.Background(), tc.req); !res.OK {
						b.Errorf("probe failed: %+v", res)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "probes/s")
		})
	}
}

func forwardProxyB(b *testing.B) string {
	b.Helper()
	fp := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	srv := newServer(fp)
	b.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}
