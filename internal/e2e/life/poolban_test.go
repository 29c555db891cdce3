package life

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestPoolBannedEverywhereReplacesWithinTheSurge: a site that answers 403 to everyone is
// crawled through the gateway, which reports each 403 as a ban, and every proxy of a pool
// of 6 (banReplaceTargets 1, maxSurge 2) asks for a replacement at once. The pool lets
// them replace two at a time: at every look no more than 2 of its Proxies are replacing
// and the provider holds no more than 8 instances, until every member has a new one.
func TestPoolBannedEverywhereReplacesWithinTheSurge(t *testing.T) {
	const n, surge = 6, 2
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	d := s.StartDiscovery(t)

	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "go away", http.StatusForbidden)
	}))
	defer hostile.Close()

	pool := startSurgePool(t, s, ns, "banned", n, surge, func(spec *v1alpha1.ProxySpec) {
		spec.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr.To(int32(1))}
	})
	yes := true
	require.Eventually(t, func() bool { return len(d.Store.List(discovery.Selector{"run": ns}, &yes)) == n },
		3*time.Minute, 100*time.Millisecond, "six healthy proxies in discovery")

	first := instanceNames(t, s, ns, pool.Name)

	// The crawl: through the gateway, again and again; the site bans every proxy it sees.
	gw := &url.URL{Scheme: "http", User: url.UserPassword(discovery.DefaultClientName+";run="+ns, d.Token), Host: d.GatewayAddr}
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(gw)}, Timeout: time.Minute}
	crawlCtx, stopCrawl := context.WithCancel(ctx)
	var crawl sync.WaitGroup
	for range 4 {
		crawl.Go(func() {
			for crawlCtx.Err() == nil {
				req, _ := http.NewRequestWithContext(crawlCtx, http.MethodGet, hostile.URL+"/", nil)
				if resp, err := hc.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	defer func() { stopCrawl(); crawl.Wait() }()

	seen := watchSurge(t, s, ns, pool.Name, n, surge, first)
	stopCrawl()
	crawl.Wait()
	t.Logf("every member of %d banned: at most %d replacing and %d instances at once; %d looks saw a member waiting for the pool",
		n, seen.replacing, seen.instances, seen.asked)
	assert.Positive(t, seen.asked, "no member ever waited for the pool: the budget was never needed")
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, pool.Name+"-0"), "pool-grant.json")
}
