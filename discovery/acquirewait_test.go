package discovery_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/discovery/temporal/temporaltest"
)

// waitHarness is a harness served on a loopback port, for crawlers whose requests wait.
type waitHarness struct {
	*harness
	url string
}

func newWaitHarness(t *testing.T, cfg discovery.Config, proxies ...discovery.Proxy) *waitHarness {
	t.Helper()
	h := newHarness(t, cfg, proxies...)
	return serveOnLoopback(h)
}

func serveOnLoopback(h *harness) *waitHarness {
	srv := httptest.NewServer(h.handler) // 127.0.0.1
	h.t.Cleanup(srv.Close)
	return &waitHarness{harness: h, url: srv.URL}
}

func (h *waitHarness) client() *dclient.Client { return dclient.New(h.url, testToken) }

// metricValue is the value of the counter or gauge name with labels (pairs) in reg, 0 when
// absent.
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue metrics
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// waiting waits until n acquires wait for a proxy.
func (h *waitHarness) waiting(n int) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		return metricValue(h.t, h.reg, "proxyfleet_discovery_acquire_waiting") == float64(n)
	}, 20*time.Second, 5*time.Millisecond, "%d acquires waiting", n)
}

// acquireAsync acquires through c in the background; the answer comes on the channel.
type acquired struct {
	l   *dclient.Lease
	err error
}

func acquireAsync(ctx context.Context, c *dclient.Client, req dclient.AcquireRequest) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, req)
		ch <- acquired{l, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting acquire never answered")
		return acquired{}
	}
}

// TestAcquireWaitGetsAReleasedSlot: an acquire with a wait on a full proxy waits, and
// gets the slot another crawler's release frees, on the same proxy.
func TestAcquireWaitGetsAReleasedSlot(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), proxy("only", 10, true, map[string]string{"region": "eu"}))
	c := h.client()
	ctx := context.Background()
	first, err := c.Acquire(ctx, dclient.AcquireRequest{})
	require.NoError(t, err)

	ch := acquireAsync(ctx, c, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, Wait: 30 * time.Second})
	h.waiting(1)
	require.NoError(t, c.Release(ctx, first.ID))
	got := receive(t, ch)
	require.NoError(t, got.err)
	assert.Equal(t, "only", got.l.Proxy.Name)
	assert.NotEqual(t, first.ID, got.l.ID)
	h.waiting(0)
	assert.Equal(t, 1.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "granted"))
	assert.Equal(t, 1, h.store.Stats().Leases)
}

// TestAcquireWaitForAProxyTheIndexGains: an acquire whose selector matches no proxy (a
// pool scaled to zero) waits, and is granted on the proxy the index gains from Temporal.
func TestAcquireWaitForAProxyTheIndexGains(t *testing.T) {
	kr := newKeyring(t)
	h := serveOnLoopback(newLoadingHarness(t, defaultConfig()))
	lister := &temporaltest.Scripted{}
	ref := &temporal.Refresher{Client: lister, Namespace: "default", Store: h.store, Keyring: kr,
		Log: slog.New(slog.NewTextHandler(h.logs, nil))}
	require.NoError(t, ref.Full(t.Context())) // an empty fleet, loaded

	c := h.client()
	ctx := context.Background()
	sel := map[string]string{"pool": "scaled"}
	_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: sel})
	require.True(t, dclient.IsNoMatch(err), "no proxy yet: %v", err)

	ch := acquireAsync(ctx, c, dclient.AcquireRequest{Selector: sel, Wait: 30 * time.Second})
	h.waiting(1)
	m := temporaltest.ReadyMemo("started")
	m.Attributes = sel
	lister.Set(running(m))
	require.NoError(t, ref.Full(t.Context()))
	got := receive(t, ch)
	require.NoError(t, got.err)
	assert.Equal(t, "started", got.l.Proxy.Name)
	assert.Equal(t, 1.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "granted"))
}

// TestAcquireWaitElapses: a wait that ends with no proxy free answers today's 409, with
// its counts and Retry-After, after the wait and not before.
func TestAcquireWaitElapses(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), proxy("only", 10, true, nil))
	h.acquire(`{}`)
	start := time.Now()
	rec, err := http.NewRequest(http.MethodPost, h.url+"/v1/leases", strings.NewReader(`{"waitSeconds": 1}`))
	require.NoError(t, err)
	rec.Header.Set("Authorization", "Bearer "+testToken)
	rec.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(rec)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "the wait is served in full")
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, "300", resp.Header.Get("Retry-After"), "the lease held expires in 5 minutes (the store's clock stands)")

	_, err = h.client().Acquire(context.Background(), dclient.AcquireRequest{Wait: time.Second})
	var nm *dclient.Error
	require.ErrorAs(t, err, &nm)
	assert.Equal(t, dclient.CodeNoMatch, nm.Code)
	assert.Equal(t, 1, nm.Considered)
	assert.Equal(t, 1, nm.AtCapacity)
	assert.Equal(t, 300, nm.RetryAfterSeconds)
	assert.Equal(t, 2.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "timeout"))
	h.waiting(0)
}

// TestAcquireWaitCrawlerHangsUp: a crawler that hangs up mid-wait holds nothing: the slot
// that frees up afterwards is not leased to it.
func TestAcquireWaitCrawlerHangsUp(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), proxy("only", 10, true, nil))
	first := h.acquire(`{}`)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, h.client(), dclient.AcquireRequest{Wait: 30 * time.Second})
	h.waiting(1)
	cancel()
	require.Error(t, receive(t, ch).err)
	h.waiting(0)
	require.Eventually(t, func() bool {
		return metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "canceled") == 1
	}, 10*time.Second, 5*time.Millisecond)
	rec := h.do(http.MethodDelete, "/v1/leases/"+first.LeaseID, "")
	require.Equal(t, http.StatusNoContent, rec.Code)
	assert.Equal(t, 0, h.store.Stats().Leases, "no lease held for the crawler that left")
	assert.Equal(t, 0.0, metricValue(t, h.reg, "proxyfleet_discovery_leases_active"))
	assert.Equal(t, 0.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "granted"))
}

// TestAcquireWaitOverTheMaximum: a wait over --max-acquire-wait, or below zero, is a 400
// naming waitSeconds, not a silent clamp.
func TestAcquireWaitOverTheMaximum(t *testing.T) {
	cfg := defaultConfig()
	cfg.MaxAcquireWait = 10 * time.Second
	h := newWaitHarness(t, cfg, proxy("only", 10, true, nil))
	for _, body := range []string{`{"waitSeconds": 11}`, `{"waitSeconds": -1}`, `{"waitSeconds": 99999999999}`} {
		rec := h.do(http.MethodPost, "/v1/leases", body)
		b := requireError(t, rec, http.StatusBadRequest, "invalid")
		assert.Contains(t, b["message"], "waitSeconds", body)
	}
	h.acquire(`{"waitSeconds": 10}`) // the maximum itself is fine, and a free proxy needs no wait
	assert.Equal(t, 0.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "granted"))
}

// TestAcquireWaitAcrossReplicas: in a set of three, an acquire waiting on a replica that
// does not own the proxy is granted (by the owner) the slot a release through the third
// replica frees.
func TestAcquireWaitAcrossReplicas(t *testing.T) {
	const n = 3
	var only discovery.Proxy
	for i := 0; ; i++ {
		only = proxy(fmt.Sprintf("w%d", i), 10, true, map[string]string{"region": "eu"})
		if discovery.OwnerOf(only.ID(), n) == 0 {
			break
		}
	}
	rs := newReplicaSet(t, n, []discovery.Proxy{only})
	ctx := context.Background()
	held, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{TTL: time.Minute})
	require.NoError(t, err)
	// Replica 1 has the copy of the lease: the proxy is full there too.
	require.Eventually(t, func() bool { return rs.Nodes[1].Store.Stats().Leases == 1 }, 10*time.Second, 5*time.Millisecond)

	ch := acquireAsync(ctx, rs.Client(1), dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, Wait: 30 * time.Second})
	// Waiting on replica 1 (its first look refused), then released through replica 2.
	require.Eventually(t, func() bool { return rs.Nodes[1].API.Waiting() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, rs.Client(2).Release(ctx, held.ID))
	got := receive(t, ch)
	require.NoError(t, got.err)
	assert.Equal(t, only.Name, got.l.Proxy.Name)
	owner, ok := discovery.LeaseOwner(got.l.ID)
	require.True(t, ok)
	assert.Equal(t, 0, owner, "the proxy's owner granted it")
	require.Eventually(t, func() bool {
		for _, node := range rs.Nodes {
			if node.Store.Stats().Leases != 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "one lease, known to every replica")
}

// TestThousandWaitersCostNothing: 1,000 acquires waiting on a full fleet look at the
// store not once while nothing changes, and are all served, each once, as slots free up:
// every one that gets a lease releases it, which serves the next.
func TestThousandWaitersCostNothing(t *testing.T) {
	const (
		proxies = 10
		waiters = 1000
	)
	var fleet []discovery.Proxy
	for i := range proxies {
		p := proxy(fmt.Sprintf("p%02d", i), 10, true, nil)
		p.IP = fmt.Sprintf("10.0.0.%d", i+1)
		fleet = append(fleet, p)
	}
	h := newWaitHarness(t, defaultConfig(), fleet...)
	c := h.client()
	ctx := context.Background()
	var held []*dclient.Lease
	for range proxies {
		l, err := c.Acquire(ctx, dclient.AcquireRequest{})
		require.NoError(t, err)
		held = append(held, l)
	}

	var (
		mu     sync.Mutex
		served = map[string]int{}
		most   int
		wg     sync.WaitGroup
		errs   = make(chan error, waiters)
	)
	for range waiters {
		wg.Go(func() {
			l, err := c.Acquire(ctx, dclient.AcquireRequest{Wait: 60 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			served[l.ID]++
			most = max(most, h.store.Stats().Leases)
			mu.Unlock()
			if err := c.Release(ctx, l.ID); err != nil {
				errs <- err
			}
		})
	}
	h.waiting(waiters)
	picks, checks := h.store.Picks(), h.srv.WaitChecks()
	// Nothing changes for over two of each waiter's own periods (500ms): no look at all.
	assert.Never(t, func() bool { return h.store.Picks() != picks || h.srv.WaitChecks() != checks },
		1200*time.Millisecond, 20*time.Millisecond, "waiting cost the store a pick or a check while nothing changed")

	for _, l := range held {
		require.NoError(t, c.Release(ctx, l.ID))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Len(t, served, waiters, "every waiter served")
	for id, n := range served {
		assert.Equal(t, 1, n, "lease %s granted once", id)
	}
	assert.LessOrEqual(t, most, proxies, "never more leases than slots")
	assert.Equal(t, float64(waiters), metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "granted"))
	assert.Equal(t, 0, h.store.Stats().Leases)
	h.waiting(0)
	t.Logf("%d waiters served over %d slots with %d looks while waiting", waiters, proxies, h.srv.WaitChecks()-checks)
}

// TestAcquireWaitStopsWithDiscovery: as discovery stops, a waiting acquire is answered at
// once with a 503 that says to retry (another replica takes the wait on), and a new one
// does not wait.
func TestAcquireWaitStopsWithDiscovery(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), proxy("only", 10, true, nil))
	h.acquire(`{}`)
	ch := acquireAsync(context.Background(), h.client(), dclient.AcquireRequest{Wait: 60 * time.Second})
	h.waiting(1)
	h.srv.StopWaiting()
	got := receive(t, ch)
	require.True(t, dclient.IsReplicasUnavailable(got.err), "%v", got.err)
	var e *dclient.Error
	require.ErrorAs(t, got.err, &e)
	assert.Equal(t, 1, e.RetryAfterSeconds)
	h.waiting(0)
	assert.Equal(t, 1.0, metricValue(t, h.reg, "proxyfleet_discovery_acquire_waits_total", "outcome", "stopped"))

	start := time.Now()
	_, err := h.client().Acquire(context.Background(), dclient.AcquireRequest{Wait: 60 * time.Second})
	require.True(t, dclient.IsNoMatch(err), "%v", err)
	assert.Less(t, time.Since(start), 10*time.Second, "no wait once stopping")
}
