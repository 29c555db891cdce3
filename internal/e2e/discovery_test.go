package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// crawler is a minimal crawler speaking the discovery API over HTTP.
type crawler struct {
	t *testing.T
	d *stack.Discovery
}

type leaseBody struct {
	LeaseID string `json:"leaseID"`
	Proxy   struct {
		Name, Namespace, IP, URL string
		Port                     int32
	} `json:"proxy"`
}

func (c crawler) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(c.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.d.URL+path, rd)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.d.Token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (c crawler) lease(target string) (leaseBody, int) {
	c.t.Helper()
	code, raw := c.do(http.MethodPost, "/v1/leases", map[string]any{
		"selector": map[string]string{"region": "local"}, "ttlSeconds": 60, "target": target,
	})
	var l leaseBody
	if code == http.StatusCreated {
		require.NoError(c.t, json.Unmarshal(raw, &l))
	}
	return l, code
}

// TestCrawlerLeasesFetchesAndReportsBans runs the crawler's loop against the real system:
// lease, fetch through the proxy, report a ban; the banned target then gets another proxy,
// and keeps doing so after discovery restarts (the cooldown is durable in the workflow).
func TestCrawlerLeasesFetchesAndReportsBans(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	for _, name := range []string{"a", "b"} {
		require.NoError(t, s.Kube.Client.Create(ctx, s.LocalProxy(ns, name)))
	}
	for _, name := range []string{"a", "b"} {
		s.WaitFor(t, ns, name, time.Minute, "Ready", stack.Ready)
	}
	d := s.StartDiscovery(t)
	c := crawler{t, d}
	require.Eventually(t, func() bool {
		code, raw := c.do(http.MethodGet, "/v1/proxies?attr.region=local&healthy=true", nil)
		var list struct{ Count int }
		return code == http.StatusOK && json.Unmarshal(raw, &list) == nil && list.Count == 2
	}, 30*time.Second, 100*time.Millisecond, "discovery never listed both proxies")

	l, code := c.lease("shop.example")
	require.Equal(t, http.StatusCreated, code)
	body, err := s.Fetch(l.Proxy.IP, l.Proxy.Port, "/product/1")
	require.NoError(t, err)
	assert.Equal(t, "hello from the target: /product/1", body)
	banned := l.Proxy.Name

	code, raw := c.do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", map[string]string{"result": "banned"})
	require.Equal(t, http.StatusNoContent, code, string(raw))
	code, _ = c.do(http.MethodDelete, "/v1/leases/"+l.LeaseID, nil)
	require.Equal(t, http.StatusNoContent, code)

	// The same target now gets the other proxy, every time; another target may get either.
	for range 3 {
		l2, code := c.lease("shop.example")
		require.Equal(t, http.StatusCreated, code)
		assert.NotEqual(t, banned, l2.Proxy.Name, "a proxy banned by shop.example was offered for it again")
		c.do(http.MethodDelete, "/v1/leases/"+l2.LeaseID, nil)
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
	c2 := crawler{t, d2}
	for range 3 {
		l3, code := c2.lease("shop.example")
		require.Equal(t, http.StatusCreated, code)
		assert.NotEqual(t, banned, l3.Proxy.Name, "cooldown lost across a discovery restart")
		c2.do(http.MethodDelete, "/v1/leases/"+l3.LeaseID, nil)
	}
}

// TestUnhealthyProxyStopsBeingOffered: a proxy that fails is no longer leased within its
// failure detection time plus 3 seconds.
func TestUnhealthyProxyStopsBeingOffered(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, s.LocalProxy(ns, "only")))
	p := s.WaitFor(t, ns, "only", time.Minute, "Ready", stack.Ready)
	d := s.StartDiscovery(t)
	c := crawler{t, d}
	require.Eventually(t, func() bool {
		l, code := c.lease("")
		if code == http.StatusCreated {
			c.do(http.MethodDelete, "/v1/leases/"+l.LeaseID, nil)
		}
		return code == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond)

	// The proxy starts refusing: 3 probes at a 1s interval detect it.
	require.NoError(t, s.Local.SetFault(ctx, p.Status.InstanceName, "auth"))
	failed := time.Now()
	detection := 3*time.Second + 500*time.Millisecond // failureThreshold × interval + timeout
	deadline := failed.Add(detection + 3*time.Second)
	for {
		l, code := c.lease("")
		if code == http.StatusConflict {
			break
		}
		c.do(http.MethodDelete, "/v1/leases/"+l.LeaseID, nil)
		require.True(t, time.Now().Before(deadline), "still offered %s after it started failing", time.Since(failed).Round(100*time.Millisecond))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("stopped being offered %s after it started failing", time.Since(failed).Round(100*time.Millisecond))
	code, raw := c.do(http.MethodPost, "/v1/leases", map[string]any{"selector": map[string]string{"region": "local"}})
	require.Equal(t, http.StatusConflict, code)
	var nm struct{ Considered, Unhealthy, AtCapacity, InCooldown int }
	require.NoError(t, json.Unmarshal(raw, &nm))
	assert.Equal(t, 1, nm.Considered)
	assert.Equal(t, 1, nm.Unhealthy, string(raw))
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
	v, err := s.Temporal.Client.QueryWorkflow(context.Background(), "proxy/"+ns+"/"+name, "", "state")
	require.NoError(t, err)
	require.NoError(t, v.Get(&st))
	return st
}
