package discovery

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestCrawlerLeasesFetchesAndReportsBans runs the crawler's loop against the real system:
// lease, fetch through the proxy, report a ban; the banned target then gets another proxy,
// and keeps doing so after discovery restarts (the cooldown is durable in the workflow).
func TestCrawlerLeasesFetchesAndReportsBans(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	for _, name := range []string{"a", "b"} {
		require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, name), ns)))
	}
	for _, name := range []string{"a", "b"} {
		s.WaitFor(t, ns, name, time.Minute, "Ready", stack.Ready)
	}
	d := s.StartDiscovery(t)
	c := e2e.NewCrawler(t, d, ns)
	healthy := true
	require.Eventually(t, func() bool {
		list, err := c.Client.ListProxies(ctx, c.Selector(), &healthy)
		return err == nil && list.Count == 2
	}, 30*time.Second, 100*time.Millisecond, "discovery never listed both proxies")

	l, err := c.Lease("shop.example")
	require.NoError(t, err)
	resp, err := l.HTTPClient().Get(s.Target.URL + "/product/1")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(raw)
	require.NoError(t, err)
	assert.Equal(t, "hello from the target: /product/1", body)
	banned := l.Proxy.Name

	require.NoError(t, c.Client.Report(ctx, l.ID, client.ResultBanned, ""), "the lease's target is the default")
	c.Release(l)

	// The same target now gets the other proxy, every time; another target may get either.
	for range 3 {
		l2, err := c.Lease("shop.example")
		require.NoError(t, err)
		assert.NotEqual(t, banned, l2.Proxy.Name, "a proxy banned by shop.example was offered for it again")
		c.Release(l2)
	}

	// The workflow has the cooldown: wait for it to reach the memo, then restart discovery
	// with an empty memory.
	require.Eventually(t, func() bool {
		st := queryState(t, s, ns, banned)
		_, ok := st.Cooldowns["shop.example"]
		return ok
	}, 30*time.Second, 100*time.Millisecond, "the workflow never recorded the cooldown")
	d.Stop()
	d2 := s.StartDiscovery(t)
	c2 := e2e.NewCrawler(t, d2, ns)
	for range 3 {
		l3, err := c2.Lease("shop.example")
		require.NoError(t, err)
		assert.NotEqual(t, banned, l3.Proxy.Name, "cooldown lost across a discovery restart")
		c2.Release(l3)
	}
}

// TestUnhealthyProxyStopsBeingOffered: a proxy that fails is no longer leased within its
// failure detection time plus 3 seconds.
func TestUnhealthyProxyStopsBeingOffered(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, "only"), ns)))
	p := s.WaitFor(t, ns, "only", time.Minute, "Ready", stack.Ready)
	d := s.StartDiscovery(t)
	c := e2e.NewCrawler(t, d, ns)
	require.Eventually(t, func() bool {
		l, err := c.Lease("")
		if err == nil {
			c.Release(l)
		}
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)

	// The proxy starts refusing: 3 probes at a 1s interval detect it.
	require.NoError(t, s.Local.SetFault(ctx, p.Status.InstanceName, "auth"))
	failed := time.Now()
	detection := 3*time.Second + 500*time.Millisecond // failureThreshold × interval + timeout
	deadline := failed.Add(detection + 3*time.Second)
	var noMatch *client.Error
	for {
		l, err := c.Lease("")
		if errors.As(err, &noMatch) {
			break
		}
		c.Release(l)
		if time.Now().After(deadline) {
			cur := s.Get(t, ns, "only")
			t.Fatalf("still offered %s after it started failing; proxy phase %s, conditions %+v",
				time.Since(failed).Round(100*time.Millisecond), cur.Status.Phase, cur.Status.Conditions)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("stopped being offered %s after it started failing", time.Since(failed).Round(100*time.Millisecond))
	assert.Equal(t, 1, noMatch.Considered)
	assert.Equal(t, 1, noMatch.Unhealthy, "%+v", noMatch)
}

func queryState(t *testing.T, s *stack.Stack, ns, name string) struct {
	Cooldowns map[string]time.Time
	Phase     v1alpha1.Phase
} {
	t.Helper()
	var st struct {
		Cooldowns map[string]time.Time
		Phase     v1alpha1.Phase
	}
	v, err := s.Temporal.Client.QueryWorkflow(context.Background(), contract.ProxyWorkflowID(ns, name), "", contract.QueryState)
	require.NoError(t, err)
	require.NoError(t, v.Get(&st))
	return st
}
