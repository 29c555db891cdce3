package health

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestKilledInstanceIsDetectedAndRecreated kills a running local proxy: the Proxy turns
// Unhealthy within failureThreshold × interval plus a few seconds, the instance is created
// again, and the Proxy returns to Ready. The drift check runs only every 10 minutes here:
// the monitor that starts after the unhealthy verdict asks the provider first thing, which
// reports the instance stopped, and the next instance is created before the dead one is
// deleted. Its history joins the replay corpus (the lost-instance path).
func TestKilledInstanceIsDetectedAndRecreated(t *testing.T) {
	tuning := stack.FastTuning()
	tuning.DriftInterval = 10 * time.Minute
	s := stack.Start(t, stack.Options{Tuning: tuning})
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, s.LocalProxy(ns, "victim")))
	p := s.WaitFor(t, ns, "victim", time.Minute, "Ready", stack.Ready)
	first := p.Status.InstanceName

	_, _, err := s.Daemon.Kill(first)
	require.NoError(t, err)
	killed := time.Now()
	// 3 failures × 1s interval, plus probe timeout, jitter and the status write.
	detection := 3*time.Second + 3*time.Second
	p = s.WaitFor(t, ns, "victim", detection, "Unhealthy after the kill", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseUnhealthy
	})
	t.Logf("Unhealthy %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	healthy := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
	require.NotNil(t, healthy)
	assert.Equal(t, "False", string(healthy.Status))

	p = s.WaitFor(t, ns, "victim", time.Minute, "Ready on a new instance", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName != first
	})
	_, err = s.Fetch(p, "/recovered")
	require.NoError(t, err)
	_, stillThere := s.Daemon.Get(first)
	assert.False(t, stillThere, "the dead instance was deleted")
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "victim"), "lost-instance.json")
}

// TestExternalProxyFollowsItsEndpoint points an External Proxy at a forward proxy on
// loopback that this system does not manage, with its credentials in a Secret: Ready while
// it serves, Unhealthy once it stops.
func TestExternalProxyFollowsItsEndpoint(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	creds := proxyauth.Credentials{Username: "partner", Password: "partner-password"}
	srv := &http.Server{Handler: &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	host, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)

	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "partner-credentials",
		Labels: map[string]string{v1alpha1.LabelProxyCredentials: "true"}},
		StringData: map[string]string{"username": creds.Username, "password": creds.Password}}))
	p := s.LocalProxy(ns, "partner")
	p.Spec = v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeExternal,
		Endpoint: &v1alpha1.Endpoint{Host: host, Port: int32(port),
			CredentialsSecretRef: &v1alpha1.SecretRef{Name: "partner-credentials"}},
		HealthCheck: p.Spec.HealthCheck,
		MaxLeases:   4,
	}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	p = s.WaitFor(t, ns, "partner", time.Minute, "Ready", stack.Ready)
	assert.Equal(t, host, p.Status.IP)
	assert.Equal(t, int32(port), p.Status.Port)
	before := len(s.Events())

	require.NoError(t, srv.Close())
	s.WaitFor(t, ns, "partner", 6*time.Second, "Unhealthy after the endpoint stopped", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseUnhealthy
	})
	assert.Len(t, s.Events(), before, "External proxies never create or delete instances")
}
