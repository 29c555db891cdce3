package security

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enums "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestExternalProxyBehindRealSquid points an External Proxy at Debian's Squid, configured
// by the project's renderer to require a password, with the password in a Secret: the
// Proxy goes Ready, a crawler's lease carries credentials that get a request through, a
// wrong password in the Secret makes it Unhealthy with failure kind proxy_auth, and the
// right one makes it Ready again.
func TestExternalProxyBehindRealSquid(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	creds := proxyauth.Credentials{Username: "partner", Password: "squid-canary-password"}
	_, targetPort, err := net.SplitHostPort(strings.TrimPrefix(s.Target.URL, "http://"))
	require.NoError(t, err)
	port, err := strconv.Atoi(targetPort)
	require.NoError(t, err)
	// The target is on loopback, which the renderer refuses by default; this Squid stands
	// in for a commercial proxy whose own rules are not ours to test here.
	sq := squidtest.Start(t, squid.Config{Credentials: creds, Denied: []netip.Prefix{}, Ports: []int32{int32(port)}})
	host, sqPort, err := net.SplitHostPort(sq.Addr)
	require.NoError(t, err)
	p64, err := strconv.Atoi(sqPort)
	require.NoError(t, err)

	ns := s.Namespace(t)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "squid-credentials", Labels: credentialsLabel},
		Data: map[string][]byte{"username": []byte(creds.Username), "password": []byte(creds.Password)}}
	require.NoError(t, s.Kube.Client.Create(ctx, secret))
	p := s.LocalProxy(ns, "partner")
	p.Spec = v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeExternal,
		Endpoint: &v1alpha1.Endpoint{Host: host, Port: int32(p64),
			CredentialsSecretRef: &v1alpha1.SecretRef{Name: secret.Name}},
		Attributes:  map[string]v1alpha1.AttributeValue{"region": "local", "run": v1alpha1.AttributeValue(ns)},
		HealthCheck: p.Spec.HealthCheck,
		MaxLeases:   4,
	}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	s.WaitFor(t, ns, "partner", time.Minute, "Ready through real Squid with the Secret's credentials", stack.Ready)

	d := s.StartDiscovery(t)
	c := e2e.NewCrawler(t, d, ns)
	var lease *dclient.Lease
	require.Eventually(t, func() bool {
		lease, err = c.Lease("")
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "discovery never offered the External proxy: %v", err)
	assert.Equal(t, creds.Username, lease.Proxy.Username)
	assert.Equal(t, creds.Password, lease.Proxy.Password)
	resp, err := lease.HTTPClient().Get(s.Target.URL + "/through-squid")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "/through-squid")
	c.Release(lease)

	// A wrong password in the Secret: the monitor reads it within a drift interval, and
	// Squid refuses it.
	secret.Data["password"] = []byte("not-the-password")
	require.NoError(t, s.Kube.Client.Update(ctx, secret))
	p = s.WaitFor(t, ns, "partner", time.Minute, "Unhealthy with the wrong password", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseUnhealthy
	})
	healthy := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
	require.NotNil(t, healthy)
	assert.True(t, strings.HasPrefix(healthy.Message, "proxy_auth: "), "Healthy condition: %q", healthy.Message)
	assert.NotContains(t, healthy.Message, "not-the-password")

	secret.Data["password"] = []byte(creds.Password)
	require.NoError(t, s.Kube.Client.Update(ctx, secret))
	s.WaitFor(t, ns, "partner", time.Minute, "Ready again with the right password", stack.Ready)

	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "partner", time.Minute)
	// A run that reads, rotates and publishes sealed credentials, for the replay corpus.
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "partner"), "external-credentials.json")
}

// credentialsLabel lets a Secret serve as an External proxy's credentials.
var credentialsLabel = map[string]string{v1alpha1.LabelProxyCredentials: "true"}

// TestExternalCredentialsNeedTheLabel: an External Proxy that names a Secret without the
// label crawl.example.com/proxy-credentials=true (anyone who may create a Proxy could
// name any Secret of the namespace) gets nothing from it: not one request reaches the
// endpoint, and the Proxy is Unhealthy with reason CredentialsNotLabelled, naming the
// Secret and the label. Labelling the Secret makes it Ready within the drift interval,
// the Proxy untouched.
func TestExternalCredentialsNeedTheLabel(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	creds := proxyauth.Credentials{Username: "partner", Password: "unlabelled-canary-password"}
	var asked atomic.Int32
	fwd := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		fwd.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	host, portText, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portText)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "someone-elses"},
		StringData: map[string]string{"username": creds.Username, "password": creds.Password}}
	require.NoError(t, s.Kube.Client.Create(ctx, secret))
	p := s.LocalProxy(ns, "partner")
	p.Spec = v1alpha1.ProxySpec{
		Mode:        v1alpha1.ModeExternal,
		Endpoint:    &v1alpha1.Endpoint{Host: host, Port: int32(port), CredentialsSecretRef: &v1alpha1.SecretRef{Name: secret.Name}},
		HealthCheck: p.Spec.HealthCheck,
		MaxLeases:   4,
	}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	p = s.WaitFor(t, ns, "partner", time.Minute, "Unhealthy for want of the label", func(p *v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	healthy := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy)
	assert.Equal(t, v1alpha1.ReasonCredentialsNotLabelled, healthy.Reason)
	assert.Contains(t, healthy.Message, "credentials Secret "+ns+"/someone-elses lacks the label crawl.example.com/proxy-credentials=true")
	assert.False(t, meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady))
	assert.Zero(t, asked.Load(), "nothing was sent to the endpoint")

	require.NoError(t, s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(secret), secret))
	secret.Labels = credentialsLabel
	require.NoError(t, s.Kube.Client.Update(ctx, secret))
	ready := s.WaitFor(t, ns, "partner", time.Minute, "Ready once the Secret is labelled", stack.Ready)
	assert.Equal(t, p.Generation, ready.Generation, "the Proxy was not touched")
	assert.Equal(t, v1alpha1.ReasonProbeSucceeded, meta.FindStatusCondition(ready.Status.Conditions, v1alpha1.ConditionHealthy).Reason)
	assert.Positive(t, asked.Load())
}

// TestCredentialsNeverLeaveTheLeaseAnswer runs a Managed proxy and an External one whose
// Secret holds a canary password, leases both, fetches through both, and then searches
// every workflow history (memos included: they are recorded as upserts), every memo
// discovery reads, every log line of every component at debug level, and every span for
// the passwords, in the clear, base64'd or as a Basic header. Only the lease answers may
// carry them.
func TestCredentialsNeverLeaveTheLeaseAnswer(t *testing.T) {
	spans, tc := e2e.Traced(t)
	logs := &testenv.LogBuffer{}
	s := stack.Start(t, stack.Options{Client: tc, Log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := context.Background()
	ns := s.Namespace(t)

	// An External proxy (the project's forward proxy) whose password is the canary.
	external := proxyauth.Credentials{Username: "partner", Password: fmt.Sprintf("external-canary-%d", time.Now().UnixNano())}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: &localproxy.ForwardProxy{Auth: local.NewAuth(external)}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	host, portText, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portText)
	require.NoError(t, s.Kube.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "partner", Labels: credentialsLabel},
		StringData: map[string]string{"username": external.Username, "password": external.Password}}))
	ext := s.LocalProxy(ns, "external")
	ext.Spec = v1alpha1.ProxySpec{
		Mode:        v1alpha1.ModeExternal,
		Endpoint:    &v1alpha1.Endpoint{Host: host, Port: int32(port), CredentialsSecretRef: &v1alpha1.SecretRef{Name: "partner"}},
		Attributes:  map[string]v1alpha1.AttributeValue{"region": "local", "run": v1alpha1.AttributeValue(ns), "kind": "external"},
		HealthCheck: ext.Spec.HealthCheck, MaxLeases: 4,
	}
	require.NoError(t, s.Kube.Client.Create(ctx, ext))

	managed := s.LocalProxy(ns, "managed")
	managed.Spec.Attributes = map[string]v1alpha1.AttributeValue{"region": "local", "run": v1alpha1.AttributeValue(ns), "kind": "managed"}
	require.NoError(t, s.Kube.Client.Create(ctx, managed))
	s.WaitFor(t, ns, "external", time.Minute, "Ready", stack.Ready)
	managed = s.WaitFor(t, ns, "managed", time.Minute, "Ready", stack.Ready)
	managedCreds, err := s.Keyring.Managed(s.Keyring.PrimaryID(), managed.Status.InstanceName)
	require.NoError(t, err)

	// Crawlers lease both and use them; the lease answers carry the credentials.
	d := s.StartDiscovery(t)
	dc := dclient.New(d.URL, d.Token)
	for kind, want := range map[string]proxyauth.Credentials{"external": external, "managed": managedCreds} {
		var lease *dclient.Lease
		require.Eventually(t, func() bool {
			lease, err = dc.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"run": ns, "kind": kind}, TTL: time.Minute})
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "no lease of the %s proxy: %v", kind, err)
		assert.Equal(t, want.Password, lease.Proxy.Password, kind)
		u, err := url.Parse(lease.Proxy.URL)
		require.NoError(t, err)
		pw, _ := u.User.Password()
		assert.Equal(t, want.Password, pw, "%s: the URL's userinfo", kind)
		resp, err := lease.HTTPClient().Get(s.Target.URL + "/" + kind)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, kind)
		require.NoError(t, dc.Report(ctx, lease.ID, dclient.ResultBanned, "example.com"))
		require.NoError(t, dc.Release(ctx, lease.ID))
	}
	// Listings never carry them.
	listing, err := dc.ListProxies(ctx, map[string]string{"run": ns}, nil)
	require.NoError(t, err)
	raw, err := json.Marshal(listing)
	require.NoError(t, err)

	var needles []string
	for _, c := range []proxyauth.Credentials{external, managedCreds} {
		needles = append(needles, c.Password, base64.StdEncoding.EncodeToString([]byte(c.Password)),
			strings.TrimPrefix(c.Header(), "Basic "))
	}
	found := func(where string, b []byte) {
		t.Helper()
		for _, n := range needles {
			assert.False(t, bytes.Contains(b, []byte(n)), "a password (%q...) is in %s", n[:8], where)
		}
	}
	found("a listing", raw)

	// Every history of the namespace's workflows: signals, activity inputs and results,
	// memo and search attribute upserts.
	histories := 0
	resp, err := s.Temporal.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Query: fmt.Sprintf("WorkflowId STARTS_WITH %q", contract.ProxyWorkflowIDPrefix+ns+"/"),
	})
	require.NoError(t, err)
	for _, ex := range resp.Executions {
		memo, err := proto.Marshal(ex.GetMemo())
		require.NoError(t, err)
		found("the memo of "+ex.Execution.WorkflowId, memo)
		it := s.Temporal.Client.GetWorkflowHistory(ctx, ex.Execution.WorkflowId, ex.Execution.RunId, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			ev, err := it.Next()
			require.NoError(t, err)
			b, err := proto.Marshal(ev)
			require.NoError(t, err)
			found(fmt.Sprintf("history of %s, event %d (%s)", ex.Execution.WorkflowId, ev.EventId, ev.EventType), b)
		}
		histories++
	}
	require.Equal(t, 2, histories, "both proxies' histories were searched")

	found("the logs", logs.Bytes())
	require.NotEmpty(t, logs.Bytes(), "the components logged nothing: the search proves nothing")
	got := spans.GetSpans()
	require.NotEmpty(t, got)
	for _, sp := range got {
		for _, a := range sp.Attributes {
			found("span "+sp.Name+" attribute "+string(a.Key), []byte(a.Value.String()))
		}
		for _, ev := range sp.Events {
			for _, a := range ev.Attributes {
				found("span "+sp.Name+" event "+ev.Name, []byte(a.Value.String()))
			}
		}
		found("span "+sp.Name+" status", []byte(sp.Status.Description))
	}
}
