package activities_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestMonitorReadsAnExternalProxysCredentials walks an External proxy's credentials
// through the monitor: read from the Secret and handed back sealed, presented by the
// probes, read again when the Secret changes, and reported when they stop working or the
// Secret goes away. The proxy is the project's forward proxy, requiring a password.
func TestMonitorReadsAnExternalProxysCredentials(t *testing.T) {
	f := newFixture(t)
	f.acts.Keyring = testKeys(t)
	kube := testenv.Kube(t).Client
	ctx := context.Background()
	const uid = "uid-external"
	first := proxyauth.Credentials{Username: "partner", Password: "first-canary-password"}

	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(target.Close)
	proxy := httptest.NewServer(&localproxy.ForwardProxy{Auth: local.NewAuth(first)})
	t.Cleanup(proxy.Close)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "partner-credentials", Labels: credentialsLabel},
		Data: map[string][]byte{"username": []byte(first.Username), "password": []byte(first.Password)}}
	require.NoError(t, kube.Create(ctx, secret))

	input := func(sealed string, last activities.Health) activities.MonitorInput {
		return activities.MonitorInput{
			Target: proxy.Listener.Addr().String(),
			HealthCheck: v1alpha1.HealthCheck{URL: target.URL + "/", Interval: "1s", Timeout: "500ms",
				SuccessThreshold: 1, FailureThreshold: 2, ExpectedStatus: 200},
			Last: last, DriftInterval: time.Second,
			Auth: &activities.ProbeAuth{Namespace: f.ns, Secret: secret.Name, UID: uid, Sealed: sealed},
		}
	}
	run := func(in activities.MonitorInput) activities.MonitorResult {
		t.Helper()
		v, err := f.env.ExecuteActivity(f.acts.Monitor, in)
		require.NoError(t, err)
		var res activities.MonitorResult
		require.NoError(t, v.Get(&res))
		return res
	}

	// Nothing sealed yet: the monitor returns the Secret's credentials, sealed, at once.
	res := run(input("", activities.Health{}))
	require.Equal(t, activities.MonitorCredentials, res.Reason)
	assert.NotContains(t, res.Sealed, first.Password)
	got, err := f.acts.Keyring.Open(res.Sealed, uid)
	require.NoError(t, err)
	assert.Equal(t, first, got)
	sealedFirst := res.Sealed

	// With them, the probes pass.
	res = run(input(sealedFirst, activities.Health{}))
	require.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.True(t, res.Health.Healthy, "%+v", res.Health)

	// The Secret is rotated: within a drift interval the monitor hands back the new ones.
	second := proxyauth.Credentials{Username: "partner", Password: "second-canary-password"}
	secret.Data["password"] = []byte(second.Password)
	require.NoError(t, kube.Update(ctx, secret))
	res = run(input(sealedFirst, activities.Health{Known: true, Healthy: true}))
	require.Equal(t, activities.MonitorCredentials, res.Reason)
	got, err = f.acts.Keyring.Open(res.Sealed, uid)
	require.NoError(t, err)
	assert.Equal(t, second, got)

	// The proxy still wants the first password: the new one is refused, and the verdict
	// says so (failure kind proxy_auth, as the Proxy's status will).
	res = run(input(res.Sealed, activities.Health{Known: true, Healthy: true}))
	require.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, res.Health.FailureKind)
	assert.Contains(t, res.Health.LastFailure, "refused the credentials")
	assert.NotContains(t, res.Health.LastFailure, second.Password)

	// A Secret without its keys, and a missing one, are named in the verdict.
	delete(secret.Data, "username")
	require.NoError(t, kube.Update(ctx, secret))
	res = run(input(sealedFirst, activities.Health{Known: true, Healthy: true}))
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, res.Health.FailureKind)
	assert.Contains(t, res.Health.LastFailure, `needs the keys "username" and "password"`)

	require.NoError(t, kube.Delete(ctx, secret))
	res = run(input(sealedFirst, activities.Health{Known: true, Healthy: true}))
	assert.False(t, res.Health.Healthy)
	assert.Contains(t, res.Health.LastFailure, "credentials Secret "+f.ns+"/partner-credentials not found")
}

// credentialsLabel is the label that lets a Secret serve as an External proxy's credentials.
var credentialsLabel = map[string]string{v1alpha1.LabelProxyCredentials: "true"}

// secretGets is the activities' Kubernetes client, noting the type of every object it
// gets.
type secretGets struct {
	client.Client
	mu   sync.Mutex
	gets []string
}

func (c *secretGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	c.gets = append(c.gets, fmt.Sprintf("%T", obj))
	c.mu.Unlock()
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *secretGets) took() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.gets)
}

// TestMonitorUsesOnlyALabelledCredentialsSecret: a Secret without the label
// crawl.example.com/proxy-credentials=true is never read beyond its metadata and nothing
// is sent to the endpoint; the verdict says why, with its own condition reason, and drops
// credentials sealed from it before. Once the label is there, the next read takes them.
func TestMonitorUsesOnlyALabelledCredentialsSecret(t *testing.T) {
	f := newFixture(t)
	f.acts.Keyring = testKeys(t)
	kube := &secretGets{Client: testenv.Kube(t).Client}
	f.acts.Kube = kube
	ctx := context.Background()
	const uid = "uid-unlabelled"
	creds := proxyauth.Credentials{Username: "partner", Password: "unlabelled-canary-password"}

	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(target.Close)
	var asked, withCreds atomic.Int32
	fwd := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if r.Header.Get("Proxy-Authorization") != "" {
			withCreds.Add(1)
		}
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "exfiltrate-me"},
		Data: map[string][]byte{"username": []byte(creds.Username), "password": []byte(creds.Password)}}
	require.NoError(t, kube.Create(ctx, secret))
	input := func(sealed string, last activities.Health) activities.MonitorInput {
		return activities.MonitorInput{
			Target: proxy.Listener.Addr().String(),
			HealthCheck: v1alpha1.HealthCheck{URL: target.URL + "/", Interval: "1s", Timeout: "500ms",
				SuccessThreshold: 1, FailureThreshold: 1, ExpectedStatus: 200},
			Last: last, DriftInterval: time.Second,
			Auth: &activities.ProbeAuth{Namespace: f.ns, Secret: secret.Name, UID: uid, Sealed: sealed},
		}
	}
	run := func(in activities.MonitorInput) activities.MonitorResult {
		t.Helper()
		v, err := f.env.ExecuteActivity(f.acts.Monitor, in)
		require.NoError(t, err)
		var res activities.MonitorResult
		require.NoError(t, v.Get(&res))
		return res
	}

	// A new Proxy naming the unlabelled Secret: unhealthy, saying which label to add.
	res := run(input("", activities.Health{}))
	require.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, v1alpha1.ReasonCredentialsNotLabelled, res.Health.FailureReason)
	assert.Contains(t, res.Health.LastFailure, "credentials Secret "+f.ns+"/exfiltrate-me lacks the label crawl.example.com/proxy-credentials=true")
	assert.Empty(t, res.Sealed)
	assert.Zero(t, asked.Load(), "nothing is sent to the endpoint")
	assert.NotContains(t, kube.took(), "*v1.Secret", "only the Secret's metadata is read")

	// Credentials sealed from it before the label was required are dropped at once.
	sealed, err := f.acts.Keyring.Seal(creds, uid)
	require.NoError(t, err)
	res = run(input(sealed, activities.Health{Known: true, Healthy: true}))
	require.Equal(t, activities.MonitorCredentials, res.Reason)
	assert.Empty(t, res.Sealed)
	assert.Zero(t, asked.Load())

	// Labelled, it serves: the next read hands the credentials back, and probes pass.
	unhealthy := activities.Health{Known: true, LastFailure: "lacks the label", FailureReason: v1alpha1.ReasonCredentialsNotLabelled}
	secret.Labels = credentialsLabel
	require.NoError(t, kube.Update(ctx, secret))
	res = run(input("", unhealthy))
	require.Equal(t, activities.MonitorCredentials, res.Reason)
	got, err := f.acts.Keyring.Open(res.Sealed, uid)
	require.NoError(t, err)
	assert.Equal(t, creds, got)
	res = run(input(res.Sealed, unhealthy))
	require.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.True(t, res.Health.Healthy, "%+v", res.Health)
	assert.Empty(t, res.Health.FailureReason)
	assert.Positive(t, withCreds.Load())
}

// TestCreateGivesTheInstanceCredentials: the instance requires the credentials derived from
// the primary fleet key and its name, and the result names the key. A worker without a
// fleet key creates nothing: an instance without credentials would be an open proxy.
func TestCreateGivesTheInstanceCredentials(t *testing.T) {
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = d.Serve(ctx, ln) }()
	f := newFixture(t)
	f.acts.Providers = map[v1alpha1.Provider]provider.Provider{v1alpha1.ProviderLocal: local.NewProvider("http://" + ln.Addr().String())}
	in := activities.InstanceInput{Provider: v1alpha1.ProviderLocal, Name: "px-creds-1", ProxyUID: "uid", Namespace: f.ns,
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}}

	_, err = f.env.ExecuteActivity(f.acts.CreateInstance, in)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no fleet key")
	_, exists := d.Get(in.Name)
	assert.False(t, exists, "nothing is created without credentials")

	f.acts.Keyring = testKeys(t)
	v, err := f.env.ExecuteActivity(f.acts.CreateInstance, in)
	require.NoError(t, err)
	var res activities.CreateResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, f.acts.Keyring.PrimaryID(), res.KeyID)
	assert.Equal(t, res.KeyID, res.Instance.Labels[provider.LabelKeyID])

	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(target.Close)
	creds, err := f.acts.Keyring.Managed(res.KeyID, in.Name)
	require.NoError(t, err)
	addr := net.JoinHostPort(res.Instance.IP, strconv.Itoa(int(res.Instance.Port)))
	ok := probe.Probe(ctx, probe.Request{Proxy: addr, URL: target.URL, Credentials: creds})
	assert.True(t, ok.OK, "%+v", ok)
	bare := probe.Probe(ctx, probe.Request{Proxy: addr, URL: target.URL})
	assert.Equal(t, probe.KindProxyAuth, bare.Kind)
}

// TestRotatedFleetKeyResealsOnlyAtTheDriftInterval: a worker whose primary fleet key is
// newer than the one an External proxy's credentials were sealed with probes with them as
// they are, and re-seals them under its primary only at the drift interval: a rollout that
// runs workers with different primaries side by side must not make every Monitor return
// at once.
func TestRotatedFleetKeyResealsOnlyAtTheDriftInterval(t *testing.T) {
	f := newFixture(t)
	old := testKeys(t)
	rotated, err := proxyauth.Parse(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("n", proxyauth.MinKeyBytes))) + "\n" +
		base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a", proxyauth.MinKeyBytes))))
	require.NoError(t, err)
	require.Equal(t, old.PrimaryID(), rotated.IDs()[1])
	f.acts.Keyring = rotated
	kube := testenv.Kube(t).Client
	ctx := context.Background()
	creds := proxyauth.Credentials{Username: "partner", Password: "rotation-password"}
	require.NoError(t, kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "partner", Labels: credentialsLabel},
		Data: map[string][]byte{"username": []byte(creds.Username), "password": []byte(creds.Password)}}))
	sealedOld, err := old.Seal(creds, "uid-r")
	require.NoError(t, err)

	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(target.Close)
	proxy := httptest.NewServer(&localproxy.ForwardProxy{Auth: local.NewAuth(creds)})
	t.Cleanup(proxy.Close)
	in := activities.MonitorInput{
		Target: proxy.Listener.Addr().String(),
		HealthCheck: v1alpha1.HealthCheck{URL: target.URL + "/", Interval: "1s", Timeout: "500ms",
			SuccessThreshold: 1, FailureThreshold: 2, ExpectedStatus: 200},
		DriftInterval: time.Hour,
		Auth:          &activities.ProbeAuth{Namespace: f.ns, Secret: "partner", UID: "uid-r", Sealed: sealedOld},
	}
	v, err := f.env.ExecuteActivity(f.acts.Monitor, in)
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, activities.MonitorVerdict, res.Reason, "the same credentials under an older key are not a change")
	assert.True(t, res.Health.Healthy)

	in.Last, in.DriftInterval = res.Health, time.Second
	v, err = f.env.ExecuteActivity(f.acts.Monitor, in)
	require.NoError(t, err)
	require.NoError(t, v.Get(&res))
	require.Equal(t, activities.MonitorCredentials, res.Reason, "at the drift interval they move to the primary key")
	assert.Equal(t, rotated.PrimaryID(), proxyauth.SealedKeyID(res.Sealed))
	got, err := rotated.Open(res.Sealed, "uid-r")
	require.NoError(t, err)
	assert.Equal(t, creds, got)
}

// TestUnhealthyProxyIsToldItsSecretIsNotLabelled: a proxy already unhealthy for another
// reason (its Secret did not exist yet, the usual order when a Proxy is applied before its
// Secret) learns that the Secret now there lacks the label, and the other way round: the
// Healthy condition must not keep saying "not found" while the fix is to add the label.
func TestUnhealthyProxyIsToldItsSecretIsNotLabelled(t *testing.T) {
	f := newFixture(t)
	f.acts.Keyring = testKeys(t)
	kube := testenv.Kube(t).Client
	ctx := context.Background()
	require.NoError(t, kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "applied-later"},
		Data: map[string][]byte{"username": []byte("u"), "password": []byte("p")}}))

	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	env := f.NewTestActivityEnvironment()
	env.RegisterActivity(f.acts)
	env.SetWorkerOptions(worker.Options{BackgroundActivityContext: actx})
	in := activities.MonitorInput{
		Target: "127.0.0.1:1",
		HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "1s", Timeout: "500ms",
			SuccessThreshold: 1, FailureThreshold: 1, ExpectedStatus: 200},
		Last: activities.Health{Known: true, Healthy: false, FailureKind: probe.KindProxyAuth,
			LastFailure: "credentials Secret " + f.ns + "/applied-later not found"},
		DriftInterval: time.Second,
		Auth:          &activities.ProbeAuth{Namespace: f.ns, Secret: "applied-later", UID: "uid-later"},
	}
	v, err := env.ExecuteActivity(f.acts.Monitor, in)
	require.NoError(t, err, "the Monitor never reported that the Secret lacks the label")
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, v1alpha1.ReasonCredentialsNotLabelled, res.Health.FailureReason)
	assert.Contains(t, res.Health.LastFailure, "lacks the label")
}

// forbiddenSecrets refuses every read of a Secret, as an API server does once the
// worker's role no longer grants it.
type forbiddenSecrets struct{ client.Client }

func (c forbiddenSecrets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	switch obj.(type) {
	case *corev1.Secret, *metav1.PartialObjectMetadata:
		return apierrors.NewForbidden(corev1.Resource("secrets"), key.Name, errors.New("RBAC: not allowed"))
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestARefusedSecretReadSendsNothingSealedBefore: credentials sealed from a Secret are used
// when the Secret cannot be read for a passing reason, never when the read is refused: a
// role narrowed on purpose (or credentials sealed before the label was required) must not
// keep them going to the endpoint.
func TestARefusedSecretReadSendsNothingSealedBefore(t *testing.T) {
	f := newFixture(t)
	f.acts.Keyring = testKeys(t)
	f.acts.Kube = forbiddenSecrets{Client: testenv.Kube(t).Client}
	// A Monitor that probes with the old credentials sees a healthy proxy and never
	// returns: bound it.
	bounded, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	f.env.SetWorkerOptions(worker.Options{BackgroundActivityContext: bounded})
	const uid = "uid-refused"
	creds := proxyauth.Credentials{Username: "partner", Password: "refused-canary-password"}
	sealed, err := f.acts.Keyring.Seal(creds, uid)
	require.NoError(t, err)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(target.Close)
	var withCreds atomic.Int32
	fwd := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" {
			withCreds.Add(1)
		}
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	v, err := f.env.ExecuteActivity(f.acts.Monitor, activities.MonitorInput{
		Target: proxy.Listener.Addr().String(),
		HealthCheck: v1alpha1.HealthCheck{URL: target.URL + "/", Interval: "1s", Timeout: "500ms",
			SuccessThreshold: 1, FailureThreshold: 1, ExpectedStatus: 200},
		Last: activities.Health{Known: true, Healthy: true}, DriftInterval: time.Second,
		Auth: &activities.ProbeAuth{Namespace: f.ns, Secret: "partner", UID: uid, Sealed: sealed},
	})
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	assert.False(t, res.Health.Healthy)
	assert.Contains(t, res.Health.LastFailure, "forbidden")
	assert.Zero(t, withCreds.Load(), "the credentials sealed before were sent")
}
