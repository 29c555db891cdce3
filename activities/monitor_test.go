package activities_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// monitorEnv runs Monitor for real: a local daemon with real forward proxies and a target.
type monitorEnv struct {
	testsuite.WorkflowTestSuite
	daemon *localproxy.Daemon
	prov   *local.Provider
	target string
	acts   *activities.Activities
}

func newMonitorEnv(t *testing.T) *monitorEnv {
	t.Helper()
	m := &monitorEnv{}
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = d.Serve(ctx, ln) }()
	t.Cleanup(cancel)
	m.daemon, m.prov = d, local.NewProvider("http://"+ln.Addr().String())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(srv.Close)
	m.target = srv.URL + "/healthz"
	m.acts = &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderLocal: m.prov}, Installation: "test", Keyring: testKeys(t)}
	return m
}

func (m *monitorEnv) instance(t *testing.T, name string) (provider.Instance, activities.InstanceInput) {
	t.Helper()
	req := provider.CreateRequest{Name: name, ProxyUID: "uid", Installation: "test", Namespace: "ns",
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}, KeyID: m.acts.Keyring.PrimaryID()}
	var err error
	req.Credentials, err = m.acts.Keyring.Managed(req.KeyID, name)
	require.NoError(t, err)
	inst, err := m.prov.Create(context.Background(), req)
	require.NoError(t, err)
	return inst, activities.InstanceInput{Provider: v1alpha1.ProviderLocal, Name: name, ProviderID: inst.ProviderID, Spec: req.Spec}
}

func (m *monitorEnv) input(inst provider.Instance, last activities.Health) activities.MonitorInput {
	return activities.MonitorInput{
		Target: net.JoinHostPort(inst.IP, strconv.Itoa(int(inst.Port))),
		HealthCheck: v1alpha1.HealthCheck{URL: m.target, Interval: "1s", Timeout: "500ms",
			SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200},
		Last: last, DriftInterval: time.Hour,
		Auth: &activities.ProbeAuth{KeyID: m.acts.Keyring.PrimaryID(), Instance: inst.Name},
	}
}

func (m *monitorEnv) run(t *testing.T, in activities.MonitorInput, heartbeat any) activities.MonitorResult {
	t.Helper()
	env := m.NewTestActivityEnvironment()
	env.RegisterActivity(m.acts)
	if heartbeat != nil {
		env.SetHeartbeatDetails(heartbeat)
	}
	v, err := env.ExecuteActivity(m.acts.Monitor, in)
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	return res
}

func TestMonitorFirstVerdict(t *testing.T) {
	m := newMonitorEnv(t)
	inst, _ := m.instance(t, "px-mon-1")
	start := time.Now()
	res := m.run(t, m.input(inst, activities.Health{}), nil)
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.True(t, res.Health.Known && res.Health.Healthy, "%+v", res.Health)
	assert.Less(t, time.Since(start), 5*time.Second, "two probes, about one interval apart")
}

func TestMonitorDetectsAFailedProxy(t *testing.T) {
	m := newMonitorEnv(t)
	inst, _ := m.instance(t, "px-mon-2")
	_, _, err := m.daemon.SetFault("px-mon-2", local.FaultAuth)
	require.NoError(t, err)
	res := m.run(t, m.input(inst, activities.Health{Known: true, Healthy: true}), nil)
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, res.Health.FailureKind)
	assert.Contains(t, res.Health.LastFailure, "407")
}

// TestMonitorProbesWithTheInstanceCredentials: the probe presents the credentials derived
// for the instance; one derived for another instance (or a key that is not the instance's)
// is refused, and the verdict says so.
func TestMonitorProbesWithTheInstanceCredentials(t *testing.T) {
	m := newMonitorEnv(t)
	inst, _ := m.instance(t, "px-mon-auth")
	in := m.input(inst, activities.Health{Known: true, Healthy: true})
	in.Auth.Instance = "px-mon-other"
	res := m.run(t, in, nil)
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, res.Health.FailureKind)
	assert.Contains(t, res.Health.LastFailure, "refused the credentials")

	in = m.input(inst, activities.Health{Known: true, Healthy: true})
	in.Auth.KeyID = "00000000"
	res = m.run(t, in, nil)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindProxyAuth, res.Health.FailureKind)
	assert.Contains(t, res.Health.LastFailure, "not in the keyring")
}

func TestMonitorResumesCountsFromHeartbeat(t *testing.T) {
	m := newMonitorEnv(t)
	inst, _ := m.instance(t, "px-mon-3")
	_, _, err := m.daemon.Kill("px-mon-3")
	require.NoError(t, err)
	// A previous attempt had seen two failures; the third makes the verdict.
	hb := map[string]any{"health": map[string]any{"known": true, "healthy": true}, "consecFail": 2}
	start := time.Now()
	res := m.run(t, m.input(inst, activities.Health{Known: true, Healthy: true}), hb)
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Equal(t, probe.KindRefused, res.Health.FailureKind)
	assert.Less(t, time.Since(start), 2*time.Second, "one probe (after a jittered first wait) should do")
}

func TestMonitorReportsDrift(t *testing.T) {
	m := newMonitorEnv(t)
	inst, ii := m.instance(t, "px-mon-4")
	in := m.input(inst, activities.Health{Known: true, Healthy: true})
	in.Instance = &ii
	in.DriftInterval = time.Second
	_, err := m.daemon.Delete("px-mon-4")
	require.NoError(t, err)
	res := m.run(t, in, nil)
	// Probes fail too once the listener is gone; whichever is seen first is reported, and the
	// workflow recreates the instance either way. Drift wins when it is checked before the
	// third failed probe.
	assert.Contains(t, []string{activities.MonitorGone, activities.MonitorVerdict}, res.Reason)

	inst2, ii2 := m.instance(t, "px-mon-5")
	in2 := m.input(inst2, activities.Health{Known: true, Healthy: true})
	in2.Instance = &ii2
	in2.DriftInterval = time.Second
	_, _, err = m.daemon.Kill("px-mon-5")
	require.NoError(t, err)
	in2.HealthCheck.FailureThreshold = 100 // let drift, not probes, end it
	res = m.run(t, in2, nil)
	assert.Equal(t, activities.MonitorStopped, res.Reason)
}

// TestMonitorReportsUnhealthyBeforeAskingTheProvider: a proxy that turns unhealthy is
// reported at once even while the provider's API hangs, because crawlers must stop getting
// it now, not after a cloud call times out. The next Monitor asks the provider first thing,
// so a killed instance is still replaced at once, not a drift interval later.
func TestMonitorReportsUnhealthyBeforeAskingTheProvider(t *testing.T) {
	m := newMonitorEnv(t)
	inst, ii := m.instance(t, "px-mon-6")
	in := m.input(inst, activities.Health{Known: true, Healthy: true})
	in.Instance = &ii
	in.DriftInterval = time.Hour
	_, _, err := m.daemon.Kill("px-mon-6")
	require.NoError(t, err)

	hung := hangingGets{Provider: m.prov, calls: make(chan struct{}, 10)}
	acts := &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderLocal: hung}, Installation: "test",
		Keyring: m.acts.Keyring, CallTimeout: time.Hour}
	env := m.NewTestActivityEnvironment()
	env.RegisterActivity(acts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env.SetWorkerOptions(worker.Options{BackgroundActivityContext: ctx})
	done := make(chan activities.MonitorResult, 1)
	go func() {
		v, err := env.ExecuteActivity(acts.Monitor, in)
		var res activities.MonitorResult
		if err == nil {
			err = v.Get(&res)
		}
		assert.NoError(t, err)
		done <- res
	}()
	var res activities.MonitorResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the unhealthy verdict waited for the provider's hung API")
	}
	assert.Equal(t, activities.MonitorVerdict, res.Reason)
	assert.False(t, res.Health.Healthy)
	assert.Empty(t, hung.calls, "the provider was asked before the verdict was returned")

	in.Last = res.Health
	in.HealthCheck.FailureThreshold = 100 // probes cannot end it: only the provider check can
	res = m.run(t, in, nil)
	assert.Equal(t, activities.MonitorStopped, res.Reason)
	assert.False(t, res.Health.Healthy, "the verdict travels with it")
}

// hangingGets is a provider whose Get never answers, as a cloud API that went silent.
type hangingGets struct {
	provider.Provider
	calls chan struct{}
}

func (h hangingGets) Get(ctx context.Context, _ string) (provider.Instance, error) {
	h.calls <- struct{}{}
	<-ctx.Done()
	return provider.Instance{}, ctx.Err()
}

// silentAPI is a provider's control API on loopback that accepts every request and never
// answers, as a cloud API that went silent; calls counts the requests it got.
func silentAPI(t *testing.T) (url string, calls chan struct{}) {
	t.Helper()
	calls = make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		calls <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// TestHungProviderCallsAreCutShort: a provider call that never returns is abandoned after
// the call timeout, so the activity keeps heartbeating and can be cancelled (a wait polls
// again) or fails and is retried by Temporal (a delete), instead of holding its slot
// forever. The real local provider talks to a control API that never answers.
func TestHungProviderCallsAreCutShort(t *testing.T) {
	setup := func(t *testing.T) (chan struct{}, *activities.Activities, *testsuite.TestActivityEnvironment, context.CancelFunc) {
		url, calls := silentAPI(t)
		acts := &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderLocal: local.NewProvider(url)}, Installation: "test",
			CallTimeout: 50 * time.Millisecond, Keyring: testKeys(t)}
		var s testsuite.WorkflowTestSuite
		env := s.NewTestActivityEnvironment()
		env.RegisterActivity(acts)
		ctx, cancel := context.WithCancel(context.Background())
		env.SetWorkerOptions(worker.Options{BackgroundActivityContext: ctx})
		return calls, acts, env, cancel
	}
	in := activities.InstanceInput{Provider: v1alpha1.ProviderLocal, Name: "px-hung", PollInterval: 10 * time.Millisecond, MaxWait: time.Hour}

	t.Run("wait polls again", func(t *testing.T) {
		calls, acts, env, cancel := setup(t)
		done := make(chan error, 1)
		go func() { _, err := env.ExecuteActivity(acts.WaitRunning, in); done <- err }()
		for range 3 {
			select {
			case <-calls:
			case <-time.After(10 * time.Second):
				t.Fatal("the hung call was never cut short and tried again")
			}
		}
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the activity did not stop when cancelled")
		}
	})
	t.Run("delete fails for a retry", func(t *testing.T) {
		_, acts, env, cancel := setup(t)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := env.ExecuteActivity(acts.DeleteInstance, in); done <- err }()
		select {
		case err := <-done:
			require.Error(t, err)
			assert.Contains(t, err.Error(), "deadline exceeded")
		case <-time.After(10 * time.Second):
			t.Fatal("the hung delete was never cut short")
		}
	})
}
