// Whether the pool of leasable proxies stays whole while a whole fleet is replaced:
// BenchmarkFleetRotation rotates 200 Proxies by maxAge under 32 crawlers and reports the
// fewest leasable proxies seen, acquires and renewals by outcome, and CPU, for the stable
// fleet and for the rotation. Feeds the tables of "Fleet rotation under crawler load" in
// docs/benchmarks.md (## Fleet rotation under crawler load).

package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Windows of the rotation benchmark. The crawlers and the sampler read the current one
// for every operation and sample, so each figure lands in the window it happened in.
const (
	winBaseline int32 = iota // a stable fleet, before any proxy reached maxAge
	winRotation              // from the first replacement until the whole fleet rotated
	winAfter                 // the crawlers are stopping; counted nowhere
	winCount
)

// rotationClock marks when the rotation began and ended. The index and the Kubernetes
// watch both may see the first replacement; whichever sees it first sets the start.
type rotationClock struct {
	win        atomic.Int32
	mu         sync.Mutex
	start, end time.Time
	startedBy  string
}

// began marks the first replacement, once.
func (c *rotationClock) began(at time.Time, by string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.start.IsZero() {
		c.start, c.startedBy = at, by
		c.win.Store(winRotation)
	}
}

// ended marks the whole fleet rotated, once.
func (c *rotationClock) ended(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.end.IsZero() {
		c.end = at
		c.win.Store(winAfter)
	}
}

func (c *rotationClock) times() (start, end time.Time, by string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start, c.end, c.startedBy
}

// rotCrawl is what the crawlers did in one window. Each crawler keeps its own and they
// are summed at the end, so the crawlers share no lock.
type rotCrawl struct {
	acquires int
	// refused counts acquires that got no lease, by what was said: the API's error code
	// (no_match, index_loading, replicas_unavailable…), or "transport" when no answer came.
	refused map[string]int
	// noMatch sums the 409s' explanations: which of the matching proxies were unhealthy
	// (out of the pool) and which at capacity, to say why a refusal happened.
	noMatchUnhealthy, noMatchAtCapacity int
	renewals                            int
	// gone counts renewals that ended the lease with proxy_gone, by reason.
	gone map[string]int
	// renewErr counts renewals that failed otherwise (lease_expired, transport…): a lease
	// held 2 × hold of a 30 s TTL should never expire, so any is worth explaining.
	renewErr   map[string]int
	releaseErr int
}

func newRotCrawl() rotCrawl {
	return rotCrawl{refused: map[string]int{}, gone: map[string]int{}, renewErr: map[string]int{}}
}

func (c *rotCrawl) add(o rotCrawl) {
	c.acquires += o.acquires
	c.renewals += o.renewals
	c.releaseErr += o.releaseErr
	c.noMatchUnhealthy += o.noMatchUnhealthy
	c.noMatchAtCapacity += o.noMatchAtCapacity
	for k, v := range o.refused {
		c.refused[k] += v
	}
	for k, v := range o.gone {
		c.gone[k] += v
	}
	for k, v := range o.renewErr {
		c.renewErr[k] += v
	}
}

func sumCounts(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

// fmtCounts shows counts by key in a stable order, "0" when there are none.
func fmtCounts(m map[string]int) string {
	if sumCounts(m) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// errCode names what an API call's failure said: the error code, the status when the
// body was not an API error, or "transport" when no answer came at all.
func errCode(err error) string {
	var e *dclient.Error
	switch {
	case !errors.As(err, &e):
		return "transport"
	case e.Code != "":
		return e.Code
	default:
		return strconv.Itoa(e.Status)
	}
}

// rotSample is what discovery's index said at one moment: how many of the fleet it would
// lease (healthy, a free slot, resting for no target), how many were healthy, how many
// were in phase Replacing, and how many it held at all (a proxy missing from it is out of
// the pool without being unhealthy).
type rotSample struct {
	at                           time.Time
	leasable, healthy, replacing int
	indexed                      int
}

// outOfPool is a time a proxy of the fleet was not healthy in discovery's index: when the
// samples first and last showed it so, the phases they showed, and its address before and
// after (a changed address is a promoted replacement).
type outOfPool struct {
	name             string
	win              int32
	from, to         time.Time
	phases           []string
	addrFrom, addrTo string
}

// outSummary counts the times a proxy left the pool in window w and the proxy-seconds it
// stayed out; one still out is counted until end.
func outSummary(outs []*outOfPool, w int32, end time.Time) string {
	n, total := 0, time.Duration(0)
	for _, o := range outs {
		if o.win != w {
			continue
		}
		to := o.to
		if to.IsZero() {
			to = end
		}
		n, total = n+1, total+to.Sub(o.from)
	}
	return fmt.Sprintf("%d (%.1f s)", n, total.Seconds())
}

// explainOut describes a time a proxy left the pool, with its workflow's history around
// it, so a dip in the leasable count names its cause rather than only its size.
func explainOut(s *stack.Stack, ns string, o *outOfPool, crawlStart, rotStart time.Time) string {
	zero, where := rotStart, "rotation"
	if o.win == winBaseline {
		zero, where = crawlStart, "baseline"
	}
	rel := func(t time.Time) string { return fmt.Sprintf("%+.2fs", t.Sub(o.from).Seconds()) }
	to := "still out at the end"
	if !o.to.IsZero() {
		to = "back after " + o.to.Sub(o.from).Round(10*time.Millisecond).String() + " at " + o.addrTo
	}
	until := o.to
	if until.IsZero() {
		until = o.from.Add(10 * time.Second)
	}
	var evs []string
	events, err := proxyHistory(s, ns, o.name)
	for _, e := range events {
		at := e.GetEventTime().AsTime()
		if at.Before(o.from.Add(-5*time.Second)) || at.After(until.Add(2*time.Second)) {
			continue
		}
		desc := strings.TrimPrefix(e.GetEventType().String(), "EVENT_TYPE_")
		if r, ok := monitorReport(e); ok {
			desc = fmt.Sprintf("monitor %s healthy=%t", r.Result.Reason, r.Result.Health.Healthy)
		} else if sig := e.GetWorkflowExecutionSignaledEventAttributes(); sig != nil {
			desc = "signal " + sig.GetSignalName()
		} else if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
			desc = "activity " + a.GetActivityType().GetName()
		}
		evs = append(evs, rel(at)+" "+desc)
	}
	if err != nil {
		evs = append(evs, "history: "+err.Error())
	}
	return fmt.Sprintf("%s left the pool at %s+%.1fs (phases %v, at %s), %s; history: %s",
		o.name, where, o.from.Sub(zero).Seconds(), o.phases, o.addrFrom, to, strings.Join(evs, ", "))
}

// quantileInt is the q-quantile of xs (sorted in place), 0 for none.
func quantileInt(xs []int, q float64) int {
	if len(xs) == 0 {
		return 0
	}
	sort.Ints(xs)
	return xs[int(q*float64(len(xs)-1))]
}

// BenchmarkFleetRotation rotates a whole fleet by maxAge under crawler load. ROTATION_N
// (default 200) local Proxies with spec.lifecycle.maxAge 10m (the API's minimum) are
// applied at once, so every instance reaches its maxAge within the seconds the fleet took
// to provision, and the whole fleet is replaced at about the same time. ROTATION_CRAWLERS
// (default 32) crawlers run a closed loop through the Go client from the moment the fleet
// is Ready until it has rotated: acquire, hold ROTATION_HOLD (default 200 ms), renew, hold
// again, release; a renewal that answers proxy_gone ends that lease and the crawler
// acquires again. Every 100 ms the benchmark counts the proxies discovery's index would
// lease.
//
// It reports, for the baseline window (the stable fleet, from the crawlers' start to the
// first replacement) and the rotation window (from the first replacement until every
// Proxy is Ready with status.replacements ≥ 1): the fewest leasable proxies seen (the
// goal is never below the fleet size), acquires per second, acquires refused by code,
// renewals ended by proxy_gone by reason, and for the rotation how long it took and the
// leasable count's p1 and median over the samples. It asserts nothing about speed; it
// fails if the rotation does not finish within ROTATION_DEADLINE (default 10m) of its
// start, or a crawler's request is malformed.
//
//	go test ./internal/benchmarks -run '^$' -bench FleetRotation -benchtime 1x -timeout 60m
func BenchmarkFleetRotation(b *testing.B) {
	n := envInt(b, "ROTATION_N", 200)
	crawlers := envInt(b, "ROTATION_CRAWLERS", 32)
	hold := envDuration(b, "ROTATION_HOLD", 200*time.Millisecond)
	limit := envDuration(b, "ROTATION_DEADLINE", 10*time.Minute)
	const (
		maxAge = "10m" // the API's minimum: the shortest wait for a whole fleet to age
		// The lease TTL is far longer than a hold, so a lease ends only by release or by
		// proxy_gone, never by expiry: an expiry would be the benchmark's own doing.
		ttl         = 30 * time.Second
		sampleEvery = 100 * time.Millisecond
		// A crawler refused a lease waits this long before asking again, as a crawler with
		// a backoff would; without it a refused crawler would spin and count thousands of
		// refusals for one moment without a proxy.
		refusedBackoff = 100 * time.Millisecond
	)

	s := stack.Start(b, stack.Options{})
	for b.Loop() {
		ns := s.Namespace(b)
		selector := map[string]string{"run": ns}
		applyStart := time.Now()
		names := applyFleet(b, s, ns, "rot", n, func(_ int, p *v1alpha1.Proxy) {
			stack.Tagged(p, ns)
			age := v1alpha1.Duration(maxAge)
			p.Spec.Lifecycle = &v1alpha1.Lifecycle{MaxAge: &age}
		})
		waitAllReady(b, s, ns, n, 10*time.Minute)
		ready := time.Now()
		b.Logf("%d Proxies applied and Ready in %s", len(names), ready.Sub(applyStart).Round(100*time.Millisecond))

		d := s.StartDiscovery(b)
		indexSel := discovery.Selector(selector)
		leasableNow := func() (rotSample, []discovery.ProxyView) {
			// The store's own listing, as GET /v1/proxies?attr.run=<ns> answers it, without
			// the HTTP: the fleet's proxies with their health, phase and lease counts.
			smp := rotSample{at: time.Now()}
			views := d.Store.List(indexSel, nil)
			for _, v := range views {
				smp.indexed++
				if v.Phase == string(v1alpha1.PhaseReplacing) {
					smp.replacing++
				}
				if !v.Healthy {
					continue
				}
				smp.healthy++
				if v.ActiveLeases < v.MaxLeases && len(v.Resting) == 0 {
					smp.leasable++
				}
			}
			return smp, views
		}
		// Wait for the whole fleet in discovery's index before crawling, so the baseline
		// starts from what discovery can offer, not from its first load.
		waitUntil(b, time.Minute, "discovery's index to show the fleet leasable", func() (bool, string) {
			smp, _ := leasableNow()
			return smp.leasable == n, fmt.Sprintf("%d of %d leasable", smp.leasable, n)
		})

		var clock rotationClock
		clock.win.Store(winBaseline)
		ctx, stop := context.WithCancel(context.Background())

		// The Kubernetes side: the end of the rotation is every Proxy Ready on its second
		// instance; a Proxy in phase Replacing also marks the start, if the index has not.
		type k8sState struct {
			phase        v1alpha1.Phase
			replacements int32
			ready        bool
		}
		var (
			k8sMu         sync.Mutex
			k8s           = map[string]k8sState{}
			maxReplacingK int
			twice         = map[string]bool{} // Proxies replaced more than once
		)
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		watchDone := make(chan error, 1)
		go func() {
			watchDone <- watchProxies(watchCtx, s, ns, func(p *v1alpha1.Proxy, deleted bool) bool {
				k8sMu.Lock()
				defer k8sMu.Unlock()
				if deleted {
					delete(k8s, p.Name)
					return false
				}
				k8s[p.Name] = k8sState{phase: p.Status.Phase, replacements: p.Status.Replacements, ready: stack.Ready(p)}
				if p.Status.Replacements > 1 {
					twice[p.Name] = true
				}
				replacing, rotated := 0, 0
				for _, st := range k8s {
					if st.phase == v1alpha1.PhaseReplacing {
						replacing++
					}
					if st.ready && st.replacements >= 1 {
						rotated++
					}
				}
				maxReplacingK = max(maxReplacingK, replacing)
				now := time.Now()
				if replacing > 0 || p.Status.Replacements > 0 {
					clock.began(now, "the Kubernetes watch")
				}
				if rotated == n {
					clock.ended(now)
					return true
				}
				return false
			})
		}()

		// The sampler: discovery's index every 100 ms, kept per window.
		samples := make([][]rotSample, winCount)
		cpu := map[int32]cpuSample{winBaseline: takeCPUSample()}
		out := map[string]*outOfPool{} // the fleet's proxies out of the pool now
		var outs []*outOfPool          // every time one left it, in order
		sampleDone := make(chan struct{})
		go func() {
			defer close(sampleDone)
			tk := time.NewTicker(sampleEvery)
			defer tk.Stop()
			last := winBaseline
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				smp, views := leasableNow()
				if smp.replacing > 0 {
					clock.began(smp.at, "discovery's index")
				}
				w := clock.win.Load()
				if w != last {
					// The CPU each window used, taken where the window changes.
					cpu[w], last = takeCPUSample(), w
				}
				samples[w] = append(samples[w], smp)
				// Which proxies are out of the pool, to say afterwards why.
				for _, v := range views {
					addr := fmt.Sprintf("%s:%d", v.IP, v.Port)
					o := out[v.Name]
					switch {
					case !v.Healthy && o == nil:
						o = &outOfPool{name: v.Name, win: w, from: smp.at, addrFrom: addr}
						out[v.Name] = o
						outs = append(outs, o)
						fallthrough
					case !v.Healthy:
						if len(o.phases) == 0 || o.phases[len(o.phases)-1] != v.Phase {
							o.phases = append(o.phases, v.Phase)
						}
					case o != nil:
						o.to, o.addrTo = smp.at, addr
						delete(out, v.Name)
					}
				}
			}
		}()

		// The crawlers.
		transport := &http.Transport{MaxIdleConns: 2 * crawlers, MaxIdleConnsPerHost: 2 * crawlers}
		defer transport.CloseIdleConnections()
		hc := &http.Client{Transport: transport, Timeout: 10 * time.Second}
		per := make([][winCount]rotCrawl, crawlers)
		crawlStart := time.Now()
		var wg sync.WaitGroup
		for i := range crawlers {
			for w := range winCount {
				per[i][w] = newRotCrawl()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dclient.New(d.URL, d.Token, dclient.WithHTTPClient(hc))
				req := dclient.AcquireRequest{Selector: selector, TTL: ttl, Target: fmt.Sprintf("site-%d.example", i%8)}
				for ctx.Err() == nil {
					st := &per[i][clock.win.Load()]
					l, err := c.Acquire(ctx, req)
					if err != nil {
						if ctx.Err() != nil {
							return
						}
						code := errCode(err)
						st.refused[code]++
						var e *dclient.Error
						if errors.As(err, &e) && e.Code == dclient.CodeNoMatch {
							st.noMatchUnhealthy += e.Unhealthy
							st.noMatchAtCapacity += e.AtCapacity
						}
						if !pause(ctx, refusedBackoff) {
							return
						}
						continue
					}
					st.acquires++
					if !pause(ctx, hold) {
						_ = c.Release(context.Background(), l.ID)
						return
					}
					st = &per[i][clock.win.Load()]
					if _, err := c.Renew(ctx, l.ID, ttl); err != nil {
						if ctx.Err() != nil {
							_ = c.Release(context.Background(), l.ID)
							return
						}
						var e *dclient.Error
						if dclient.IsProxyGone(err) && errors.As(err, &e) {
							// The lease has ended: acquire again at once, as Held does.
							st.gone[e.Reason]++
							continue
						}
						st.renewErr[errCode(err)]++
					} else {
						st.renewals++
					}
					if !pause(ctx, hold) {
						_ = c.Release(context.Background(), l.ID)
						return
					}
					if err := c.Release(ctx, l.ID); err != nil && ctx.Err() == nil {
						per[i][clock.win.Load()].releaseErr++
					}
				}
			}()
		}

		// The deadlines: the first replacement within 5 minutes of maxAge after Ready (the
		// instances are older than the Proxies' readiness, so maxAge comes sooner), and the
		// whole rotation within limit of its start. Checked each second; the watch itself
		// says when the rotation is done.
		startBy := ready.Add(15 * time.Minute)
		var werr error
		check := time.NewTicker(time.Second)
	wait:
		for {
			select {
			case werr = <-watchDone:
				break wait
			case <-check.C:
			}
			start, _, _ := clock.times()
			if start.IsZero() && time.Now().After(startBy) || !start.IsZero() && time.Since(start) > limit {
				stopWatch()
				werr = fmt.Errorf("deadline passed: %w", <-watchDone)
				break wait
			}
		}
		check.Stop()
		stop()
		wg.Wait()
		<-sampleDone
		cpuEnd := takeCPUSample()
		rotStart, rotEnd, startedBy := clock.times()
		if werr != nil || rotEnd.IsZero() {
			k8sMu.Lock()
			var behind []string
			for _, name := range slices.Sorted(maps.Keys(k8s)) {
				if st := k8s[name]; !st.ready || st.replacements < 1 {
					behind = append(behind, fmt.Sprintf("%s %s/%d", name, st.phase, st.replacements))
				}
			}
			k8sMu.Unlock()
			if len(behind) > 10 {
				behind = append(behind[:10], "…")
			}
			b.Fatalf("the fleet did not rotate (started %v, by %s; deadline %s after it): %v; not rotated (phase/replacements): %s",
				!rotStart.IsZero(), startedBy, limit, werr, strings.Join(behind, ", "))
		}
		require.False(b, rotStart.IsZero(), "the rotation ended without a start")

		var totals [winCount]rotCrawl
		for w := range winCount {
			totals[w] = newRotCrawl()
			for i := range crawlers {
				totals[w].add(per[i][w])
			}
		}
		base, rot := totals[winBaseline], totals[winRotation]
		baseFor, rotFor := rotStart.Sub(crawlStart), rotEnd.Sub(rotStart)

		stats := func(smps []rotSample) (minLeasable, p1, p50, minHealthy, minIndexed, maxReplacing int) {
			var leasable []int
			minLeasable, minHealthy, minIndexed = n, n, n
			for _, smp := range smps {
				leasable = append(leasable, smp.leasable)
				minLeasable = min(minLeasable, smp.leasable)
				minHealthy = min(minHealthy, smp.healthy)
				minIndexed = min(minIndexed, smp.indexed)
				maxReplacing = max(maxReplacing, smp.replacing)
			}
			return minLeasable, quantileInt(leasable, 0.01), quantileInt(leasable, 0.5), minHealthy, minIndexed, maxReplacing
		}
		bMin, bP1, bP50, bHealthy, bIndexed, _ := stats(samples[winBaseline])
		rMin, rP1, rP50, rHealthy, rIndexed, rReplacing := stats(samples[winRotation])

		// The rotation's course in 5 s steps: the fewest leasable and the most Replacing
		// in each, to show when the pool shrank, if it did.
		var course []string
		if smps := samples[winRotation]; len(smps) > 0 {
			step := 5 * time.Second
			for from := rotStart; from.Before(rotEnd); from = from.Add(step) {
				lo, repl, seen := n, 0, false
				for _, smp := range smps {
					if !smp.at.Before(from) && smp.at.Before(from.Add(step)) {
						lo, repl, seen = min(lo, smp.leasable), max(repl, smp.replacing), true
					}
				}
				if seen {
					course = append(course, fmt.Sprintf("+%ds %d/%d", int(from.Sub(rotStart)/time.Second), lo, repl))
				}
			}
		}

		k8sMu.Lock()
		replacedTwice := len(twice)
		maxReplK := maxReplacingK
		k8sMu.Unlock()

		perSec := func(c rotCrawl, d time.Duration) float64 { return float64(c.acquires) / d.Seconds() }
		var tbl strings.Builder
		row := func(figure, baseline, rotation string) {
			fmt.Fprintf(&tbl, "\n  %-52s | %-26s | %s", figure, baseline, rotation)
		}
		row("figure", "baseline (stable fleet)", "rotation")
		row("window", baseFor.Round(100*time.Millisecond).String(), rotFor.Round(100*time.Millisecond).String()+" (first replacement → all Ready on a new instance)")
		row("samples of discovery's index (every 100 ms)", strconv.Itoa(len(samples[winBaseline])), strconv.Itoa(len(samples[winRotation])))
		row("fewest leasable proxies seen (goal: "+strconv.Itoa(n)+")", strconv.Itoa(bMin), strconv.Itoa(rMin))
		row("leasable p1 / p50 over the samples", fmt.Sprintf("%d / %d", bP1, bP50), fmt.Sprintf("%d / %d", rP1, rP50))
		row("fewest healthy in the index / fewest in the index", fmt.Sprintf("%d / %d", bHealthy, bIndexed), fmt.Sprintf("%d / %d", rHealthy, rIndexed))
		row("most in phase Replacing at once (index / Kubernetes)", "0", fmt.Sprintf("%d / %d", rReplacing, maxReplK))
		row("times a proxy left the pool (proxy-seconds out)", outSummary(outs, winBaseline, rotEnd), outSummary(outs, winRotation, rotEnd))
		row("acquires (per second)", fmt.Sprintf("%d (%.1f/s)", base.acquires, perSec(base, baseFor)), fmt.Sprintf("%d (%.1f/s)", rot.acquires, perSec(rot, rotFor)))
		row("acquires refused", fmtCounts(base.refused), fmtCounts(rot.refused))
		row("in the 409s: proxies unhealthy / at capacity", fmt.Sprintf("%d / %d", base.noMatchUnhealthy, base.noMatchAtCapacity), fmt.Sprintf("%d / %d", rot.noMatchUnhealthy, rot.noMatchAtCapacity))
		row("renewals that kept the lease", strconv.Itoa(base.renewals), strconv.Itoa(rot.renewals))
		row("renewals ended proxy_gone, by reason", fmtCounts(base.gone), fmtCounts(rot.gone))
		row("renewals failed otherwise", fmtCounts(base.renewErr), fmtCounts(rot.renewErr))
		row("releases failed", strconv.Itoa(base.releaseErr), strconv.Itoa(rot.releaseErr))
		row("CPU (cores)", cpu[winRotation].since(cpu[winBaseline]).cores(baseFor), cpuEnd.since(cpu[winRotation]).cores(rotFor))
		// Printed, not logged: the testing package keeps only the first 10 lines of a
		// benchmark's log, and the table is the benchmark's result.
		fmt.Printf("\nfleet rotation: %d Proxies, maxAge %s, %d crawlers holding %s twice (a renewal between); the rotation's start seen first by %s%s\n",
			n, maxAge, crawlers, hold, startedBy, tbl.String())
		fmt.Printf("the rotation in 5 s steps (+seconds fewest-leasable/most-Replacing): %s\n", strings.Join(course, ", "))
		if replacedTwice > 0 {
			fmt.Printf("%d Proxies were replaced more than once before the whole fleet had rotated once\n", replacedTwice)
		}
		for i, o := range outs {
			if i == 10 {
				fmt.Printf("… and %d more times a proxy left the pool\n", len(outs)-i)
				break
			}
			fmt.Println(explainOut(s, ns, o, crawlStart, rotStart))
		}
		b.Logf("fleet rotation: %d Proxies; fewest leasable %d in the baseline, %d in the rotation (%s); table on stdout",
			n, bMin, rMin, rotFor.Round(100*time.Millisecond))

		b.ReportMetric(float64(n), "fleet")
		b.ReportMetric(float64(bMin), "baseline-min-leasable")
		b.ReportMetric(perSec(base, baseFor), "baseline-acquires/s")
		b.ReportMetric(float64(sumCounts(base.refused)), "baseline-refused")
		b.ReportMetric(float64(rMin), "rotation-min-leasable")
		b.ReportMetric(float64(rP1), "rotation-p1-leasable")
		b.ReportMetric(perSec(rot, rotFor), "rotation-acquires/s")
		b.ReportMetric(float64(sumCounts(rot.refused)), "rotation-refused")
		b.ReportMetric(float64(rot.gone[discovery.ProxyGoneReplaced]), "gone-replaced")
		b.ReportMetric(float64(rot.gone[discovery.ProxyGoneUnhealthy]), "gone-unhealthy")
		b.ReportMetric(float64(rot.gone[discovery.ProxyGoneRemoved]), "gone-removed")
		b.ReportMetric(rotFor.Seconds(), "s-rotation")

		require.Positive(b, base.acquires, "no lease in the baseline")
		require.Positive(b, rot.acquires, "no lease during the rotation")
		// Refusals and proxy_gone are what the benchmark measures; an invalid request is
		// the benchmark's own mistake.
		for _, t := range totals[:winAfter] {
			for _, code := range []string{dclient.CodeInvalid, dclient.CodeInvalidSelector, dclient.CodeUnauthorized} {
				require.Zero(b, t.refused[code]+t.renewErr[code], "requests refused as %s: the benchmark's requests are wrong", code)
			}
		}
	}
}

// pause waits d unless ctx ends first: a crawler's hold of a lease or its backoff, the
// workload itself, not a wait for the system to reach some state.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// waitUntil checks cond every 100 ms until it holds, and fails after within, saying what
// was awaited and the last state cond described.
func waitUntil(tb testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-deadline.C:
			tb.Fatalf("waited %s for %s: %s", within, what, state)
		case <-tk.C:
		}
	}
}

// watchProxies calls seen for every Proxy of the namespace as it is now and then for every
// change, until seen returns true (nil) or ctx ends (its error). A watch the API server
// ends (a timeout or compaction) is followed by a fresh list, which calls seen for every
// Proxy again. It watches rather than lists in a loop for the reason waitAllReady does.
func watchProxies(ctx context.Context, s *stack.Stack, ns string, seen func(p *v1alpha1.Proxy, deleted bool) bool) error {
	wc, err := client.NewWithWatch(s.Kube.Config, client.Options{Scheme: s.Kube.Scheme})
	if err != nil {
		return err
	}
	for {
		var list v1alpha1.ProxyList
		if err := wc.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for i := range list.Items {
			if seen(&list.Items[i], false) {
				return nil
			}
		}
		w, err := wc.Watch(ctx, &v1alpha1.ProxyList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*v1alpha1.Proxy)
			if !ok {
				continue
			}
			if seen(p, ev.Type == watch.Deleted) {
				w.Stop()
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
