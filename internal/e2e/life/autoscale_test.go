package life

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestPoolScalesFromZero runs an autoscaled pool of 0..3 on the whole stack (operator and
// its autoscaler, worker, local provider, discovery and its gateway): idle, it has no
// instance; an acquire that waits for its selector waits while the pool starts one and is
// granted it; once released and the scale-down delay has passed, the pool is back to no
// instance; and a gateway request for it then waits the same way and is answered by the
// site.
func TestPoolScalesFromZero(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	d := s.StartDiscovery(t)
	s.StartAutoscaler(t, d, ns, 200*time.Millisecond)

	tmpl := stack.Tagged(s.LocalProxy(ns, "template"), ns)
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "zero"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(0)),
			Template: v1alpha1.ProxyTemplate{Spec: tmpl.Spec},
			Autoscale: &v1alpha1.PoolAutoscale{MinReplicas: ptr.To(int32(0)), MaxReplicas: 3, TargetUtilization: 100,
				ScaleDownDelay: "2s"},
		},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, pool))
	sel := map[string]string{"run": ns}

	instances := func() int {
		var list v1alpha1.ProxyList
		require.NoError(t, s.Kube.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: "zero"}))
		n := 0
		for i := range list.Items {
			n += len(s.InstancesOf(list.Items[i].UID))
		}
		return n
	}
	replicas := func() int32 {
		var p v1alpha1.ProxyPool
		require.NoError(t, s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
		return ptr.Deref(p.Spec.Replicas, -1)
	}
	// Idle: the autoscaler looks, and keeps it at zero.
	require.Eventually(t, func() bool {
		var p v1alpha1.ProxyPool
		require.NoError(t, s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
		return p.Status.Demand != nil
	}, 30*time.Second, 50*time.Millisecond, "the autoscaler reads the pool's demand")
	assert.EqualValues(t, 0, replicas())
	assert.Zero(t, instances())

	// The first acquire waits while the pool starts a proxy, and gets it.
	c := dclient.New(d.URL, d.Token)
	start := time.Now()
	l, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: sel, Wait: 60 * time.Second, TTL: time.Minute})
	require.NoError(t, err, "the acquire waited for the pool to grow")
	t.Logf("first lease on an empty pool after %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, "zero-0", l.Proxy.Name)
	assert.EqualValues(t, 1, replicas())
	assert.Equal(t, 1, instances())
	fetch(t, l.Proxy.URL, s.Target.URL+"/first")

	// Released, the pool shrinks back to nothing once demand stayed at zero for 2s.
	require.NoError(t, c.Release(ctx, l.ID))
	require.Eventually(t, func() bool { return replicas() == 0 && instances() == 0 }, time.Minute, 100*time.Millisecond,
		"the idle pool gives its instance back")
	require.Eventually(t, func() bool { return len(d.Store.List(discovery.Selector(sel), nil)) == 0 }, time.Minute, 50*time.Millisecond,
		"discovery's index drops the deleted proxy")

	// A gateway request for it waits the same way, and the site answers it.
	gw := &url.URL{Scheme: "http", User: url.UserPassword(discovery.DefaultClientName+";run="+ns, d.Token), Host: d.GatewayAddr}
	fetch(t, gw.String(), s.Target.URL+"/through-the-gateway")
	assert.EqualValues(t, 1, replicas())
}

// fetch gets target through the proxy at proxyURL and requires the site's answer.
func fetch(t *testing.T, proxyURL, target string) {
	t.Helper()
	pu, err := url.Parse(proxyURL)
	require.NoError(t, err)
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 3 * time.Minute}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(target)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "hello from the target")
}
