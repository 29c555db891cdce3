//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// holding is one lease as a crawler used it: from the grant's answer to the moment it
// asked for the release. The server counts the lease for at least that long, so more
// holdings of one proxy at one instant than its maxLeases is an over-subscription.
type holding struct {
	proxy    string
	owner    int
	from, to time.Time
}

// loadStats counts what the crawlers met.
type loadStats struct {
	grants, renewals, reports, releases atomic.Int64
	unavailable, refused, noMatch       atomic.Int64
	// lost are lease operations answered as if the lease were unknown or ended early;
	// failed are answers no crawler should get here (the first of either is kept).
	lost, failed atomic.Int64
	firstErr     atomic.Value
}

func (s *loadStats) fail(counter *atomic.Int64, err error) {
	counter.Add(1)
	s.firstErr.CompareAndSwap(nil, err)
}

// TestDiscoveryReplicaKilledUnderLoad runs three discovery replicas behind no load
// balancer (each crawler call goes to a replica at random, the next one if it refuses the
// connection, as a Service does once it notices), kills -9 one of them while crawlers
// acquire, renew, report and release, and starts it again. It checks that no proxy ever
// held more leases than its maxLeases, that every lease kept working (renewals, reports
// and releases through any replica, across the kill), and that the restarted replica
// grants again.
func TestDiscoveryReplicaKilledUnderLoad(t *testing.T) {
	cfg := loadConfig(t)
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true, ProvisionDelay: 500 * time.Millisecond})
	sys := &system{s: s, ns: s.Namespace(t), cfg: cfg, want: map[string]*v1alpha1.Proxy{}, replaced: map[string]string{}}
	sys.startControlPlane(t)
	const maxLeases = 2
	for range cfg.proxies {
		p := sys.newProxy()
		p.Spec.MaxLeases = maxLeases
		sys.create(t, p)
	}
	sys.converge(t)

	addrs := freeAddrs(t, 3)
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "http://" + a
	}
	replicas := make([]*process, len(addrs))
	clients := make([]*dclient.Client, len(addrs))
	for i := range replicas {
		replicas[i] = sys.newDiscovery(t, fmt.Sprintf("discovery-%d", i), addrs[i],
			"--peers", strings.Join(urls, ","), "--replica", strconv.Itoa(i))
		replicas[i].start(t)
		clients[i] = dclient.New(urls[i], token)
	}
	for i := range replicas {
		waitReplicaReady(t, urls[i], sys.ns, cfg.proxies, clients[i])
	}

	ctx, stop := context.WithCancel(context.Background())
	var stats loadStats
	var mu sync.Mutex
	var held []holding
	var wg sync.WaitGroup
	crawlers := cfg.proxies*maxLeases + cfg.proxies/2
	for g := range crawlers {
		wg.Go(func() {
			got := crawl(ctx, g, clients, sys.ns, &stats)
			mu.Lock()
			defer mu.Unlock()
			held = append(held, got...)
		})
	}

	const victim = 1
	waitLoad(t, &stats, 5*time.Second)
	killedAt := time.Now()
	replicas[victim].kill(t)
	grantsAtKill, unavailableAtKill := stats.grants.Load(), stats.unavailable.Load()
	waitLoad(t, &stats, cfg.outage)
	replicas[victim].start(t)
	restartedAt := time.Now()
	waitReplicaReady(t, urls[victim], sys.ns, cfg.proxies, clients[victim])
	restored := time.Since(restartedAt)
	unavailableDown := stats.unavailable.Load() - unavailableAtKill
	waitLoad(t, &stats, 8*time.Second)
	stop()
	wg.Wait()

	if err, _ := stats.firstErr.Load().(error); err != nil {
		t.Errorf("a crawler's call failed: %v", err)
	}
	assert.Zero(t, stats.lost.Load(), "leases lost")
	assert.Zero(t, stats.failed.Load(), "calls failed")
	worst, where := maxConcurrent(held)
	assert.LessOrEqual(t, worst, maxLeases, "proxy %s held by %d crawlers at once", where, worst)
	var spanned, spannedVictim, victimAfter int
	for _, h := range held {
		if h.from.Before(killedAt) && h.to.After(restartedAt) {
			spanned++
			if h.owner == victim {
				spannedVictim++
			}
		}
		if h.owner == victim && h.from.After(restartedAt) {
			victimAfter++
		}
	}
	assert.Positive(t, spannedVictim, "some leases owned by the killed replica were held across its kill and restart")
	assert.Positive(t, victimAfter, "the restarted replica grants again")
	assert.Greater(t, stats.grants.Load(), grantsAtKill, "the others kept granting")
	t.Logf("replica kill under load: %d crawlers, %d proxies x %d leases; %d grants, %d renewals, %d reports, %d releases; "+
		"%d leases held across the kill (%d owned by the killed replica); %d answers 503 (retried; %d of them while the replica was down), %d connections refused, %d no_match; "+
		"restarted replica ready in %s; most leases on one proxy at once: %d; leases lost: %d",
		crawlers, cfg.proxies, maxLeases, stats.grants.Load(), stats.renewals.Load(), stats.reports.Load(), stats.releases.Load(),
		spanned, spannedVictim, stats.unavailable.Load(), unavailableDown, stats.refused.Load(), stats.noMatch.Load(),
		restored.Round(10*time.Millisecond), worst, stats.lost.Load())
}

// waitReplicaReady waits until a replica is ready and offers the whole fleet, healthy.
func waitReplicaReady(t *testing.T, url, ns string, proxies int, c *dclient.Client) {
	t.Helper()
	healthy := true
	waitFor(t, time.Minute, url+" to be ready with the fleet", func() string {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "readyz " + resp.Status
		}
		l, err := c.ListProxies(context.Background(), map[string]string{"run": ns}, &healthy)
		if err != nil {
			return err.Error()
		}
		if l.Count != proxies {
			return fmt.Sprintf("%d healthy proxies of %d", l.Count, proxies)
		}
		return ""
	})
}

// waitLoad lets the crawlers run for d: the load is the point of the wait, nothing is
// waited for. It fails early if a lease was lost.
func waitLoad(t *testing.T, stats *loadStats, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if stats.lost.Load()+stats.failed.Load() > 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crawl is one crawler until ctx ends: acquire, hold (half the crawlers for seconds,
// renewing, the others for a moment), report, release, again; each call to a replica
// at random. It returns its holdings.
func crawl(ctx context.Context, g int, clients []*dclient.Client, ns string, stats *loadStats) []holding {
	rng := rand.New(rand.NewPCG(uint64(g), 7))
	var out []holding
	sel := map[string]string{"run": ns}
	const ttl = 15 * time.Second
	// A lease granted is seen through to its release after the test stops the load.
	bg := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		var l *dclient.Lease
		call(ctx, rng, clients, stats, func(c *dclient.Client) error {
			var err error
			l, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: sel, TTL: ttl, Target: "shop.example"})
			if dclient.IsNoMatch(err) {
				stats.noMatch.Add(1)
				pause(ctx, 100*time.Millisecond)
			}
			return err
		})
		if l == nil {
			continue
		}
		stats.grants.Add(1)
		h := holding{proxy: l.Proxy.Namespace + "/" + l.Proxy.Name, from: time.Now()}
		h.owner, _ = discovery.LeaseOwner(l.ID)
		holdFor, renewals := time.Duration(50+rng.IntN(200))*time.Millisecond, 1
		if g%2 == 0 {
			holdFor, renewals = 2*time.Second, 5
		}
		for range renewals {
			pause(ctx, holdFor)
			call(bg, rng, clients, stats, func(c *dclient.Client) error {
				_, err := c.Renew(bg, l.ID, ttl)
				return lostIf(err, stats, "renew "+l.ID)
			})
			stats.renewals.Add(1)
		}
		call(bg, rng, clients, stats, func(c *dclient.Client) error {
			return lostIf(c.Report(bg, l.ID, "ok", ""), stats, "report "+l.ID)
		})
		stats.reports.Add(1)
		h.to = time.Now()
		call(bg, rng, clients, stats, func(c *dclient.Client) error {
			return c.Release(bg, l.ID)
		})
		stats.releases.Add(1)
		out = append(out, h)
	}
	return out
}

// lostIf counts an answer that says the lease is unknown or over as a lost lease, and
// stops retrying it: nothing in this test ends a lease but its crawler.
func lostIf(err error, stats *loadStats, what string) error {
	var e *dclient.Error
	if dclient.IsLeaseGone(err) || (errors.As(err, &e) && e.Code == dclient.CodeUnknownLease) {
		stats.fail(&stats.lost, fmt.Errorf("%s: %w", what, err))
		return nil
	}
	return err
}

// call makes one crawler call through a replica chosen at random, retrying (through
// another replica) while the answer is a 503 or the connection is refused, as a crawler
// behind a Service sees a replica that is down. A no_match is the caller's to handle;
// any other error is a failure.
func call(ctx context.Context, rng *rand.Rand, clients []*dclient.Client, stats *loadStats, fn func(*dclient.Client) error) {
	i := rng.IntN(len(clients))
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil {
		err := fn(clients[i])
		var e *dclient.Error
		api := errors.As(err, &e)
		switch {
		case err == nil || dclient.IsNoMatch(err):
			return
		case time.Now().After(deadline):
			stats.fail(&stats.failed, fmt.Errorf("still failing after a minute of retries: %w", err))
			return
		case !api:
			stats.refused.Add(1) // the replica is down: the next one
		case dclient.IsReplicasUnavailable(err) || dclient.IsIndexLoading(err):
			stats.unavailable.Add(1)
			pause(ctx, min(max(e.RetryAfter(), 50*time.Millisecond), 200*time.Millisecond))
		default:
			stats.fail(&stats.failed, err)
			return
		}
		i = (i + 1) % len(clients)
	}
}

// pause waits d or until ctx ends: the crawler's own pace, not a synchronisation.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// maxConcurrent is the most holdings of one proxy at one instant, and that proxy.
func maxConcurrent(hs []holding) (int, string) {
	type event struct {
		at    time.Time
		delta int
	}
	byProxy := map[string][]event{}
	for _, h := range hs {
		byProxy[h.proxy] = append(byProxy[h.proxy], event{h.from, +1}, event{h.to, -1})
	}
	worst, where := 0, ""
	for p, evs := range byProxy {
		slices.SortFunc(evs, func(a, b event) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta // an end before a start at the same instant
		})
		n := 0
		for _, e := range evs {
			n += e.delta
			if n > worst {
				worst, where = n, p
			}
		}
	}
	return worst, where
}
