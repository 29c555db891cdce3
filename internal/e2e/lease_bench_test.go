package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// flapWindow is a span during which a proxy refused every request.
type flapWindow struct{ from, to time.Time }

// leaseRecord is one lease handed out: which proxy, and when the request was sent.
type leaseRecord struct {
	proxy string
	sent  time.Time
}

// crawlStats is what a phase of the crawler load measured.
type crawlStats struct {
	took      time.Duration
	pairs     int
	latencies []time.Duration // acquire+release, per pair
	noMatch   int             // 409s
	serverErr int             // 5xx and transport errors
	leases    []leaseRecord
}

func (c crawlStats) pairsPerSec() float64 { return float64(c.pairs) / c.took.Seconds() }

func (c crawlStats) quantile(q float64) time.Duration {
	if len(c.latencies) == 0 {
		return 0
	}
	return c.latencies[int(q*float64(len(c.latencies)-1))]
}

// crawl runs n crawlers for d, each acquiring and releasing in a loop through its own
// client, and collects what they saw.
func crawl(b *testing.B, url, token string, selector map[string]string, n int, d time.Duration) crawlStats {
	transport := &http.Transport{MaxIdleConns: 2 * n, MaxIdleConnsPerHost: 2 * n}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	per := make([]crawlStats, n)
	ctx := context.Background()
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dclient.New(url, token, dclient.WithHTTPClient(hc))
			st := &per[i]
			target := fmt.Sprintf("site-%d.example", i%8)
			for time.Now().Before(stop) {
				sent := time.Now()
				l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: selector, TTL: time.Minute, Target: target})
				if err != nil {
					var apiErr *dclient.Error
					if errors.As(err, &apiErr) && apiErr.Status < 500 {
						st.noMatch++
					} else {
						st.serverErr++
					}
					continue
				}
				if err := c.Release(ctx, l.ID); err != nil {
					st.serverErr++
					continue
				}
				st.pairs++
				st.latencies = append(st.latencies, time.Since(sent))
				st.leases = append(st.leases, leaseRecord{proxy: l.Proxy.Name, sent: sent})
			}
		}()
	}
	wg.Wait()
	out := crawlStats{took: time.Since(start)}
	for _, st := range per {
		out.pairs += st.pairs
		out.noMatch += st.noMatch
		out.serverErr += st.serverErr
		out.latencies = append(out.latencies, st.latencies...)
		out.leases = append(out.leases, st.leases...)
	}
	sort.Slice(out.latencies, func(i, j int) bool { return out.latencies[i] < out.latencies[j] })
	return out
}

// BenchmarkLeasesUnderFlap runs 64 crawlers against discovery and 1,000 Ready local proxies
// (LEASE_FLEET overrides), first for 20 s with a stable fleet — the baseline — then for 60 s
// (LEASE_SECONDS) while a tenth of the proxies flap: each refuses every request for 6 s,
// then works for 6 s, staggered. It reports acquire+release pairs/s and p50/p99 pair
// latency for both phases, 5xx answers (must be 0), and leases handed out for a proxy later
// than its detection time after it started failing (must be 0). Detection time is what the
// Proxy's health check promises — failureThreshold × interval + timeout — plus discovery's
// index refresh interval.
//
//	go test ./internal/e2e -run '^$' -bench LeasesUnderFlap -benchtime 1x -timeout 60m
func BenchmarkLeasesUnderFlap(b *testing.B) {
	n, seconds := 1000, 60
	if v := os.Getenv("LEASE_FLEET"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	if v := os.Getenv("LEASE_SECONDS"); v != "" {
		var err error
		seconds, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	const (
		crawlers  = 64
		interval  = 2 * time.Second
		timeout   = 500 * time.Millisecond
		threshold = 2
		refresh   = 200 * time.Millisecond // stack.StartDiscovery's index refresh
		flapHalf  = 6 * time.Second
	)
	detection := threshold*interval + timeout + refresh

	s := stack.Start(b, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(b)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			p := tagged(s.LocalProxy(ns, fmt.Sprintf("lease-%04d", i)), ns)
			p.Spec.HealthCheck.Interval, p.Spec.HealthCheck.Timeout = v1alpha1.Duration(interval.String()), v1alpha1.Duration(timeout.String())
			p.Spec.HealthCheck.FailureThreshold = threshold
			return s.Kube.Client.Create(ctx, p)
		})
	}
	require.NoError(b, g.Wait())
	instances := map[string]string{}
	deadline := time.Now().Add(30 * time.Minute)
	for len(instances) < n {
		require.True(b, time.Now().Before(deadline), "only %d of %d Ready after 30m", len(instances), n)
		time.Sleep(2 * time.Second) // listing 1,000 Proxies is not free: poll slowly
		var list v1alpha1.ProxyList
		require.NoError(b, s.Kube.Client.List(ctx, &list))
		for _, p := range list.Items {
			if p.Namespace == ns && stack.Ready(&p) {
				instances[p.Name] = p.Status.InstanceName
			}
		}
	}
	d := s.StartDiscovery(b)
	selector := map[string]string{"run": ns}
	healthy := true
	for {
		list, err := dclient.New(d.URL, d.Token).ListProxies(ctx, selector, &healthy)
		require.NoError(b, err)
		if list.Count == n {
			break
		}
		require.True(b, time.Now().Before(deadline), "discovery lists %d of %d healthy", list.Count, n)
		time.Sleep(200 * time.Millisecond)
	}

	for b.Loop() {
		base := crawl(b, d.URL, d.Token, selector, crawlers, 20*time.Second)

		// A tenth of the fleet flaps, each proxy on its own phase of a 12 s cycle.
		var flapping []string
		for i := 0; i < n; i += 10 {
			flapping = append(flapping, fmt.Sprintf("lease-%04d", i))
		}
		var mu sync.Mutex
		windows := map[string][]flapWindow{}
		fctx, stopFlap := context.WithCancel(ctx)
		flapDone := make(chan error, 1)
		go func() {
			flapDone <- flap(fctx, s, flapping, instances, flapHalf, func(name string, failed bool, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				w := windows[name]
				if failed {
					windows[name] = append(w, flapWindow{from: at})
				} else if len(w) > 0 {
					w[len(w)-1].to = at
				}
			})
		}()
		load := crawl(b, d.URL, d.Token, selector, crawlers, time.Duration(seconds)*time.Second)
		stopFlap()
		require.NoError(b, <-flapDone)

		// For each failure window: how long after the failure the last lease of that proxy
		// was asked for. Beyond the detection time it is a late lease.
		late := 0
		var stops []time.Duration
		mu.Lock()
		last := map[string]map[int]time.Duration{}
		for _, l := range load.leases {
			for i, w := range windows[l.proxy] {
				if l.sent.Before(w.from) || (!w.to.IsZero() && !l.sent.Before(w.to)) {
					continue
				}
				after := l.sent.Sub(w.from)
				if after > detection {
					late++
				}
				if last[l.proxy] == nil {
					last[l.proxy] = map[int]time.Duration{}
				}
				last[l.proxy][i] = max(last[l.proxy][i], after)
			}
		}
		nWindows := 0
		for name, ws := range windows {
			for i := range ws {
				nWindows++
				stops = append(stops, last[name][i])
			}
		}
		mu.Unlock()
		sort.Slice(stops, func(i, j int) bool { return stops[i] < stops[j] })
		stopQ := func(q float64) float64 {
			if len(stops) == 0 {
				return 0
			}
			return stops[int(q*float64(len(stops)-1))].Seconds()
		}
		b.Logf("%d failures; the last lease of a failed proxy came p50 %.2fs / p99 %.2fs / max %.2fs after it failed (detection %s); %d late leases",
			nWindows, stopQ(0.5), stopQ(0.99), stopQ(1), detection, late)
		b.Logf("stable: %.0f pairs/s p50 %s p99 %s; flapping: %.0f pairs/s p50 %s p99 %s; 5xx %d; 409 %d",
			base.pairsPerSec(), base.quantile(0.5), base.quantile(0.99), load.pairsPerSec(), load.quantile(0.5), load.quantile(0.99),
			base.serverErr+load.serverErr, load.noMatch)
		b.ReportMetric(base.pairsPerSec(), "baseline-pairs/s")
		b.ReportMetric(float64(base.quantile(0.5).Microseconds())/1000, "baseline-p50-ms")
		b.ReportMetric(float64(base.quantile(0.99).Microseconds())/1000, "baseline-p99-ms")
		b.ReportMetric(load.pairsPerSec(), "flap-pairs/s")
		b.ReportMetric(load.pairsPerSec()/base.pairsPerSec(), "ratio")
		b.ReportMetric(float64(load.quantile(0.5).Microseconds())/1000, "flap-p50-ms")
		b.ReportMetric(float64(load.quantile(0.99).Microseconds())/1000, "flap-p99-ms")
		b.ReportMetric(float64(base.serverErr+load.serverErr), "5xx")
		b.ReportMetric(float64(load.noMatch), "409s")
		b.ReportMetric(float64(late), "late-leases")
		b.ReportMetric(stopQ(0.99), "s-p99-last-lease-after-failure")
		b.ReportMetric(detection.Seconds(), "s-detection")
		require.Zero(b, base.serverErr+load.serverErr, "server errors")
		require.Zero(b, late, "leases handed out later than the detection time after the proxy failed")
	}
}

// flap makes each proxy refuse requests for half of a 2×half cycle, staggered across the
// proxies, until ctx ends; every proxy ends working. changed is told each switch, with the
// time the daemon had applied it.
func flap(ctx context.Context, s *stack.Stack, names []string, instances map[string]string, half time.Duration, changed func(name string, failed bool, at time.Time)) error {
	start := time.Now()
	failed := make([]bool, len(names))
	set := func(i int, fail bool) error {
		fault := local.FaultNone
		if fail {
			fault = local.FaultAuth
		}
		if err := s.Local.SetFault(context.Background(), instances[names[i]], fault); err != nil {
			return err
		}
		failed[i] = fail
		changed(names[i], fail, time.Now())
		return nil
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for i := range names {
				if failed[i] {
					if err := set(i, false); err != nil {
						return err
					}
				}
			}
			return nil
		case <-tick.C:
		}
		cycle := 2 * half
		for i := range names {
			offset := time.Duration(i) * cycle / time.Duration(len(names))
			want := (time.Since(start)+offset)%cycle < half
			if want != failed[i] {
				if err := set(i, want); err != nil {
					return err
				}
			}
		}
	}
}
