// Whether a lease is ever handed out for a proxy that has failed, and what flapping costs
// the crawlers: BenchmarkLeasesUnderFlap runs 64 crawlers against discovery and 1,000 Ready
// Proxies, stable and then with a tenth of them flapping, and reports pairs/s, latencies,
// late leases and how soon each failure reached discovery's index. Feeds the tables of
// "Leases under flapping" in docs/benchmarks.md (## Leases under flapping): stable against
// flapping, and the runs with and without monitor shards.

package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// flapWindow is a span during which a proxy refused every request.
type flapWindow struct{ from, to time.Time }

// leaseRecord is one lease handed out: which proxy, and when the crawler had it (the
// answer's arrival: the strict reading of "handed out").
type leaseRecord struct {
	proxy string
	got   time.Time
}

// crawlStats is what a phase of the crawler load measured.
type crawlStats struct {
	took      time.Duration
	pairs     int
	latencies []time.Duration // acquire+release, per pair
	noMatch   int             // 409s
	serverErr int             // 5xx and transport errors
	otherErr  int             // any other error: the benchmark itself is wrong
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
// client, and collects what they saw. Crawler i uses selectors[i%len(selectors)].
func crawl(url, token string, selectors []map[string]string, n int, d time.Duration) crawlStats {
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
			selector := selectors[i%len(selectors)]
			classify := func(err error) {
				var apiErr *dclient.Error
				switch {
				case dclient.IsNoMatch(err):
					st.noMatch++
				case !errors.As(err, &apiErr) || apiErr.Status >= 500:
					st.serverErr++
				default:
					st.otherErr++
				}
			}
			for time.Now().Before(stop) {
				sent := time.Now()
				l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: selector, TTL: time.Minute, Target: target})
				if err != nil {
					classify(err)
					continue
				}
				got := time.Now()
				if err := c.Release(ctx, l.ID); err != nil {
					classify(err)
					continue
				}
				st.pairs++
				st.latencies = append(st.latencies, time.Since(sent))
				st.leases = append(st.leases, leaseRecord{proxy: l.Proxy.Name, got: got})
			}
		}()
	}
	wg.Wait()
	out := crawlStats{took: time.Since(start)}
	for _, st := range per {
		out.pairs += st.pairs
		out.noMatch += st.noMatch
		out.serverErr += st.serverErr
		out.otherErr += st.otherErr
		out.latencies = append(out.latencies, st.latencies...)
		out.leases = append(out.leases, st.leases...)
	}
	sort.Slice(out.latencies, func(i, j int) bool { return out.latencies[i] < out.latencies[j] })
	return out
}

// BenchmarkLeasesUnderFlap runs 64 crawlers against discovery and 1,000 Ready local proxies
// (LEASE_FLEET overrides), first for 20 s with a stable fleet — the baseline — then for 60 s
// (LEASE_SECONDS) while a tenth of the proxies flap: each refuses every request for 8 s,
// then works for 8 s, staggered. It reports acquire+release pairs/s and p50/p99 pair
// latency for both phases, 5xx answers (must be 0), and leases handed out for a proxy later
// than its detection time after it started failing (must be 0), and how soon discovery's
// index marked each failure. Detection time is what the Proxy's health check promises —
// failureThreshold × interval (+10% jitter) + timeout — plus a second for the verdict to
// reach the workflow's memo and discovery's index refresh interval.
//
//	go test ./internal/benchmarks -run '^$' -bench LeasesUnderFlap -benchtime 1x -timeout 60m
func BenchmarkLeasesUnderFlap(b *testing.B) {
	n, seconds := envInt(b, "LEASE_FLEET", 1000), envInt(b, "LEASE_SECONDS", 60)
	const (
		crawlers  = 64
		interval  = 2 * time.Second
		timeout   = 500 * time.Millisecond
		threshold = 2
		refresh   = 200 * time.Millisecond // stack.StartDiscovery's index refresh
		flapHalf  = 8 * time.Second        // longer than the detection time, so every failure is seen
	)
	// The detection budget: the monitor waits the interval ±10% between probes, so the last
	// of failureThreshold failing probes starts about threshold × 1.1 × interval after the
	// failure and takes at most the timeout; one second covers the probes' own durations,
	// the verdict's way to the workflow's memo (one workflow task) and the lease's way back
	// to the crawler; discovery sees the memo at its next refresh.
	detection := threshold*interval*11/10 + timeout + time.Second + refresh

	// Test timings, except the heartbeat timeout: the default (30 s) is what a fleet this
	// size runs with, and the short test one would make 1,000 monitors heartbeat every 4 s.
	tuning := stack.FastTuning()
	tuning.HeartbeatTimeout = 30 * time.Second
	s := stack.Start(b, stack.Options{Tuning: tuning})
	ctx := context.Background()
	ns := s.Namespace(b)
	names := applyFleet(b, s, ns, "lease", n, func(i int, p *v1alpha1.Proxy) {
		stack.Tagged(p, ns)
		if i%10 == 0 {
			p.Spec.Attributes["flap"] = "yes" // a tenth of the fleet
		}
		p.Spec.HealthCheck.Interval, p.Spec.HealthCheck.Timeout = v1alpha1.Duration(interval.String()), v1alpha1.Duration(timeout.String())
		p.Spec.HealthCheck.FailureThreshold = threshold
	})
	instances := map[string]string{}
	for name, p := range waitAllReady(b, s, ns, n, 30*time.Minute) {
		instances[name] = p.Status.InstanceName
	}
	deadline := time.Now().Add(time.Minute)
	cpuA := takeCPUSample()
	time.Sleep(5 * time.Second)
	b.Logf("CPU (cores) with the fleet idle, before discovery: %s", takeCPUSample().since(cpuA).cores(5*time.Second))
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
		// What the fleet costs with nobody leasing, then with the crawlers on a stable fleet.
		ev0 := fleetHistory(b, s, ns, names)
		cpu0 := takeCPUSample()
		idleFor := 10 * time.Second
		time.Sleep(idleFor)
		cpu1 := takeCPUSample()
		// A quarter of the crawlers ask for the flapping tenth (as a crawler pinned to one
		// region would): discovery's ranking is deterministic, so without them the fleet's
		// fastest proxies would take every lease and few failures would be put to the test.
		selectors := []map[string]string{selector, selector, selector, {"run": ns, "flap": "yes"}}
		base := crawl(d.URL, d.Token, selectors, crawlers, 20*time.Second)
		cpu2 := takeCPUSample()
		ev2 := fleetHistory(b, s, ns, names)
		b.Logf("history events while the fleet was idle and then crawled (stable health): %d", ev2-ev0)
		b.Logf("CPU (cores) with the fleet idle: %s", cpu1.since(cpu0).cores(idleFor))
		b.Logf("CPU (cores) with the crawlers on a stable fleet: %s", cpu2.since(cpu1).cores(base.took))

		// A tenth of the fleet flaps, each proxy on its own phase of the cycle.
		var flapping []string
		for i := 0; i < n; i += 10 {
			flapping = append(flapping, names[i]) // the ones applyFleet marked flap=yes
		}
		var mu sync.Mutex
		windows := map[string][]flapWindow{}
		fctx, stopFlap := context.WithCancel(ctx)
		// Watch discovery's index: when does each failure make the proxy unhealthy there,
		// and each recovery healthy again?
		unhealthySeen := map[string][]time.Time{}
		flips := map[string][]indexFlip{}
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			tk := time.NewTicker(50 * time.Millisecond)
			defer tk.Stop()
			was := map[string]bool{}
			for {
				select {
				case <-fctx.Done():
					return
				case <-tk.C:
				}
				now := time.Now()
				for _, v := range d.Store.List(discovery.Selector{"run": ns, "flap": "yes"}, nil) {
					if !v.Healthy != was[v.Name] {
						mu.Lock()
						if !v.Healthy {
							unhealthySeen[v.Name] = append(unhealthySeen[v.Name], now)
						}
						flips[v.Name] = append(flips[v.Name], indexFlip{at: now, healthy: v.Healthy})
						mu.Unlock()
					}
					was[v.Name] = !v.Healthy
				}
			}
		}()
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
		load := crawl(d.URL, d.Token, selectors, crawlers, time.Duration(seconds)*time.Second)
		stopFlap()
		require.NoError(b, <-flapDone)
		<-watchDone

		// For each failure window: how long after the failure the last lease of that proxy
		// was asked for. Beyond the detection time it is a late lease.
		late := 0
		var lateOnes []lateLease
		var stops []time.Duration
		mu.Lock()
		last := map[string]map[int]time.Duration{}
		for _, l := range load.leases {
			for i, w := range windows[l.proxy] {
				if l.got.Before(w.from) || (!w.to.IsZero() && !l.got.Before(w.to)) {
					continue
				}
				after := l.got.Sub(w.from)
				if after > detection {
					late++
					lateOnes = append(lateOnes, lateLease{proxy: l.proxy, window: w, got: l.got})
				}
				if last[l.proxy] == nil {
					last[l.proxy] = map[int]time.Duration{}
				}
				last[l.proxy][i] = max(last[l.proxy][i], after)
			}
		}
		nWindows := 0
		var seen []time.Duration // failure → unhealthy in discovery's index
		missed := 0              // failures that ended before discovery saw them
		var missedOnes []missedFailure
		carried := 0 // failures that began while the index still showed the one before
		for name, ws := range windows {
			for i, w := range ws {
				nWindows++
				if after, ok := last[name][i]; ok {
					stops = append(stops, after) // a failure some crawler got a lease in
				}
				if !healthyAt(flips[name], w.from) {
					// The index still showed the failure before: the proxy was never
					// leasable in this one, which is what counts.
					carried++
					continue
				}
				found := false
				for _, at := range unhealthySeen[name] {
					if !at.Before(w.from) && (w.to.IsZero() || at.Before(w.to)) {
						seen, found = append(seen, at.Sub(w.from)), true
						break
					}
				}
				if !found && !w.to.IsZero() && w.to.Sub(w.from) >= detection {
					missed++
					missedOnes = append(missedOnes, missedFailure{proxy: name, window: w})
				}
			}
		}
		// And each recovery: how long a proxy that works again stayed out of the index.
		var back []time.Duration
		stuck := 0 // recoveries the index had not shown when the next failure began
		var stuckOnes []missedFailure
		for name, ws := range windows {
			for i, w := range ws {
				if w.to.IsZero() || i+1 == len(ws) || healthyAt(flips[name], w.to) {
					// Still failing at the end, or a failure the index never showed
					// (counted above): no recovery to see.
					continue
				}
				next := ws[i+1].from
				found := false
				for _, f := range flips[name] {
					if f.healthy && !f.at.Before(w.to) && f.at.Before(next) {
						back, found = append(back, f.at.Sub(w.to)), true
						break
					}
				}
				if !found {
					stuck++
					stuckOnes = append(stuckOnes, missedFailure{proxy: name, window: flapWindow{from: w.to, to: next}})
				}
			}
		}
		sort.Slice(back, func(i, j int) bool { return back[i] < back[j] })
		if len(back) > 0 {
			b.Logf("discovery marked a recovered proxy healthy p50 %s / p99 %s / max %s after it worked again; %d recoveries unseen before the next failure",
				back[len(back)/2].Round(10*time.Millisecond), back[len(back)*99/100].Round(10*time.Millisecond), back[len(back)-1].Round(10*time.Millisecond), stuck)
			b.ReportMetric(back[len(back)/2].Seconds(), "s-p50-until-healthy-in-index")
		}
		explainLate(b, s, ns, lateOnes, unhealthySeen)
		explainMissed(b, s, ns, "failure", missedOnes, flips)
		explainMissed(b, s, ns, "recovery", stuckOnes, flips)
		if os.Getenv("LEASE_DIAG") != "" {
			leaseDiag(b, s, ns, flapping[:20], windows, unhealthySeen)
		}
		sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
		if len(seen) > 0 {
			b.ReportMetric(seen[len(seen)/2].Seconds(), "s-p50-until-unhealthy-in-index")
			b.ReportMetric(seen[len(seen)-1].Seconds(), "s-max-until-unhealthy-in-index")
			b.Logf("discovery marked a failed proxy unhealthy p50 %s / p99 %s / max %s after it failed; %d failures ended unseen; %d began while the index still showed the one before",
				seen[len(seen)/2].Round(10*time.Millisecond), seen[len(seen)*99/100].Round(10*time.Millisecond), seen[len(seen)-1].Round(10*time.Millisecond), missed, carried)
		}
		mu.Unlock()
		sort.Slice(stops, func(i, j int) bool { return stops[i] < stops[j] })
		stopQ := func(q float64) float64 {
			if len(stops) == 0 {
				return 0
			}
			return stops[int(q*float64(len(stops)-1))].Seconds()
		}
		b.Logf("%d failures, %d of them with leases handed out after the failure; in those the last lease came p50 %.2fs / p99 %.2fs / max %.2fs after it (detection %s); %d late leases",
			nWindows, len(stops), stopQ(0.5), stopQ(0.99), stopQ(1), detection, late)
		b.Logf("stable: %.0f pairs/s p50 %s p99 %s; flapping: %.0f pairs/s p50 %s p99 %s; 5xx %d; 409 %d; other errors %d",
			base.pairsPerSec(), base.quantile(0.5), base.quantile(0.99), load.pairsPerSec(), load.quantile(0.5), load.quantile(0.99),
			base.serverErr+load.serverErr, base.noMatch+load.noMatch, base.otherErr+load.otherErr)
		b.ReportMetric(base.pairsPerSec(), "baseline-pairs/s")
		b.ReportMetric(float64(base.quantile(0.5).Microseconds())/1000, "baseline-p50-ms")
		b.ReportMetric(float64(base.quantile(0.99).Microseconds())/1000, "baseline-p99-ms")
		b.ReportMetric(load.pairsPerSec(), "flap-pairs/s")
		b.ReportMetric(load.pairsPerSec()/base.pairsPerSec(), "ratio")
		b.ReportMetric(float64(load.quantile(0.5).Microseconds())/1000, "flap-p50-ms")
		b.ReportMetric(float64(load.quantile(0.99).Microseconds())/1000, "flap-p99-ms")
		b.ReportMetric(float64(base.serverErr+load.serverErr), "5xx")
		b.ReportMetric(float64(base.noMatch+load.noMatch), "409s")
		b.ReportMetric(float64(len(stops)), "failures-leased-during")
		b.ReportMetric(float64(late), "late-leases")
		b.ReportMetric(stopQ(1), "s-max-last-lease-after-failure")
		b.ReportMetric(detection.Seconds(), "s-detection")
		require.Zero(b, base.serverErr+load.serverErr, "server errors")
		require.Zero(b, base.otherErr+load.otherErr, "errors other than 409 and 5xx: the benchmark's requests are wrong")
		require.Positive(b, base.pairs, "no lease in the baseline")
		require.Positive(b, load.pairs, "no lease while flapping")
		require.GreaterOrEqual(b, len(stops), 10, "too few failures had leases handed out after them to test detection")
		require.Zero(b, late, "leases handed out later than the detection time after the proxy failed")
		require.Zero(b, missed, "failures longer than the detection time that discovery never saw")
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

// lateLease is a lease handed out after the detection time: kept to be explained.
type lateLease struct {
	proxy  string
	window flapWindow
	got    time.Time
}

// explainLate logs, for the first late lease of each proxy (at most 5 proxies), what its
// workflow and discovery's index did around the failure, so a red run says which stage was
// slow rather than only that one was.
func explainLate(b *testing.B, s *stack.Stack, ns string, late []lateLease, seen map[string][]time.Time) {
	done := map[string]bool{}
	for _, l := range late {
		if done[l.proxy] || len(done) == 5 {
			continue
		}
		done[l.proxy] = true
		var seenAt []string
		for _, at := range seen[l.proxy] {
			seenAt = append(seenAt, fmt.Sprintf("%+.2fs", at.Sub(l.window.from).Seconds()))
		}
		var evs []string
		events, err := proxyHistory(s, ns, l.proxy)
		for _, e := range events {
			at := e.GetEventTime().AsTime().Sub(l.window.from)
			if at < -5*time.Second || e.GetEventTime().AsTime().After(l.got.Add(5*time.Second)) {
				continue
			}
			evs = append(evs, fmt.Sprintf("%+.2fs %s", at.Seconds(), e.GetEventType()))
		}
		if err != nil {
			evs = append(evs, "history: "+err.Error())
		}
		b.Logf("late lease on %s: failed %s (until %+.2fs), lease at %+.2fs; index unhealthy at %v; history: %v",
			l.proxy, l.window.from.Format("15:04:05.000"), l.window.to.Sub(l.window.from).Seconds(), l.got.Sub(l.window.from).Seconds(), seenAt, evs)
	}
}

// healthyAt is whether the index showed the proxy healthy at t, from its changes (healthy
// before the first: the benchmark starts on a Ready fleet).
func healthyAt(flips []indexFlip, t time.Time) bool {
	healthy := true
	for _, f := range flips {
		if f.at.After(t) {
			break
		}
		healthy = f.healthy
	}
	return healthy
}

// indexFlip is a change of a proxy's health in discovery's index, as the benchmark saw it.
type indexFlip struct {
	at      time.Time
	healthy bool
}

// missedFailure is a failure longer than the detection time that the index never showed,
// or a recovery it had not shown when the next failure began.
type missedFailure struct {
	proxy  string
	window flapWindow
}

// explainMissed logs, for up to 5 failures (or recoveries: what) discovery never showed, the
// index's changes and the verdicts the proxy's workflow was told around it, so a red run
// says where it was lost.
func explainMissed(b *testing.B, s *stack.Stack, ns, what string, missed []missedFailure, flips map[string][]indexFlip) {
	for i, m := range missed {
		if i == 5 {
			break
		}
		rel := func(t time.Time) string { return fmt.Sprintf("%+.2fs", t.Sub(m.window.from).Seconds()) }
		from, to := m.window.from.Add(-20*time.Second), m.window.to.Add(10*time.Second)
		var idx []string
		for _, f := range flips[m.proxy] {
			if f.at.After(from) && f.at.Before(to) {
				idx = append(idx, fmt.Sprintf("%s healthy=%t", rel(f.at), f.healthy))
			}
		}
		var evs []string
		events, err := proxyHistory(s, ns, m.proxy)
		for _, e := range events {
			at := e.GetEventTime().AsTime()
			if at.Before(from) || at.After(to) {
				continue
			}
			desc := e.GetEventType().String()
			if r, ok := monitorReport(e); ok {
				desc = fmt.Sprintf("signal monitor %s healthy=%t checked %s", r.Result.Reason, r.Result.Health.Healthy, rel(r.Result.Health.CheckedAt))
			}
			evs = append(evs, rel(at)+" "+desc)
		}
		if err != nil {
			evs = append(evs, "history: "+err.Error())
		}
		b.Logf("%s of %s never shown: from %s until %s; index: %v; history: %v",
			what, m.proxy, m.window.from.Format("15:04:05.000"), rel(m.window.to), idx, evs)
	}
}

// proxyHistory is the history of a proxy's workflow, as far as it could be read.
func proxyHistory(s *stack.Stack, ns, name string) ([]*historypb.HistoryEvent, error) {
	var evs []*historypb.HistoryEvent
	it := s.Temporal.Client.GetWorkflowHistory(context.Background(), contract.ProxyWorkflowID(ns, name), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// monitorReport is the shard's report a history event carries, if it is one.
func monitorReport(e *historypb.HistoryEvent) (activities.MonitorReport, bool) {
	var r activities.MonitorReport
	sig := e.GetWorkflowExecutionSignaledEventAttributes()
	if sig == nil || sig.GetSignalName() != contract.SignalMonitor {
		return r, false
	}
	return r, converter.GetDefaultDataConverter().FromPayloads(sig.GetInput(), &r) == nil
}

// leaseDiag splits the time from a failure to discovery's index into stages, from the
// workflow histories of a few flapping proxies.
func leaseDiag(b *testing.B, s *stack.Stack, ns string, names []string, windows map[string][]flapWindow, seen map[string][]time.Time) {
	var toMonitor, toStarted, toWFT, toSeen []time.Duration
	for _, name := range names {
		evs, err := proxyHistory(s, ns, name)
		require.NoError(b, err)
		for _, w := range windows[name] {
			if w.to.IsZero() || w.to.Sub(w.from) < 5*time.Second {
				continue
			}
			var mon, started, wft time.Time
			for _, e := range evs {
				at := e.GetEventTime().AsTime()
				if at.Before(w.from) {
					continue
				}
				if r, ok := monitorReport(e); mon.IsZero() && ok && r.Result.Reason == activities.MonitorVerdict && !r.Result.Health.Healthy {
					mon = at
				}
				if !mon.IsZero() && started.IsZero() && e.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED {
					started = at
				}
				if !mon.IsZero() && e.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
					wft = at
					break
				}
			}
			if mon.IsZero() || wft.IsZero() || mon.After(w.to) {
				continue
			}
			toMonitor = append(toMonitor, mon.Sub(w.from))
			toStarted = append(toStarted, started.Sub(mon))
			toWFT = append(toWFT, wft.Sub(started))
			for _, at := range seen[name] {
				if !at.Before(w.from) {
					toSeen = append(toSeen, at.Sub(wft))
					break
				}
			}
		}
	}
	avg := func(ds []time.Duration) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		var t time.Duration
		for _, d := range ds {
			t += d
		}
		return (t / time.Duration(len(ds))).Round(10 * time.Millisecond)
	}
	b.Logf("stages (mean of %d): failure → the shard's verdict received %s; → workflow task started %s; → completed %s; → discovery index %s",
		len(toMonitor), avg(toMonitor), avg(toStarted), avg(toWFT), avg(toSeen))
}
