package monitor

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// testEnv watches real proxies: a local daemon's forward proxies, probed through to a
// loopback target, with Managed credentials derived from a test fleet key, as a worker's
// activities would set a watch up.
type testEnv struct {
	daemon *localproxy.Daemon
	prov   *local.Provider
	keys   *proxyauth.Keyring
	target string
	env    Env
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = d.Serve(ctx, ln) }()
	t.Cleanup(cancel)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(srv.Close)
	keys, err := proxyauth.Parse(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a", proxyauth.MinKeyBytes))))
	require.NoError(t, err)
	e := &testEnv{daemon: d, prov: local.NewProvider("http://" + ln.Addr().String()), keys: keys, target: srv.URL + "/healthz"}
	e.env = Env{
		Locate: func(in InstanceInput) (provider.Provider, string, error) { return e.prov, in.ProviderID, nil },
		CallContext: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 20*time.Second)
		},
		Credentials: func(_ context.Context, auth *ProbeAuth, _ bool) Credentials {
			c, err := keys.Managed(auth.KeyID, auth.Instance)
			if err != nil {
				return Credentials{Problem: err.Error()}
			}
			return Credentials{Creds: c}
		},
	}
	return e
}

// input creates a loopback proxy and returns the input of a watch of it, from last.
func (e *testEnv) input(t *testing.T, name string, last Health) Input {
	t.Helper()
	req := provider.CreateRequest{Name: name, ProxyUID: "uid", Installation: "test", Namespace: "ns",
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}, KeyID: e.keys.PrimaryID()}
	var err error
	req.Credentials, err = e.keys.Managed(req.KeyID, name)
	require.NoError(t, err)
	inst, err := e.prov.Create(context.Background(), req)
	require.NoError(t, err)
	return Input{
		Target: net.JoinHostPort(inst.IP, strconv.Itoa(int(inst.Port))),
		HealthCheck: v1alpha1.HealthCheck{URL: e.target, Interval: "1s", Timeout: "500ms",
			SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200},
		Last: last, DriftInterval: time.Hour,
		Auth:     &ProbeAuth{KeyID: e.keys.PrimaryID(), Instance: name},
		Instance: &InstanceInput{Provider: v1alpha1.ProviderLocal, Name: name, ProviderID: inst.ProviderID, Spec: req.Spec},
	}
}

// members runs watches in e reporting to signal, retrying at a test's pace.
func (e *testEnv) members(t *testing.T, signal Signaller) *members {
	ms := newMembers(e.env, signal)
	ms.retry = 10 * time.Millisecond // tests do not wait out the production backoff
	t.Cleanup(ms.stopAll)
	return ms
}

// fakeWorkflows stands in for the proxies' workflows a shard signals: it records each
// report; a workflow in gone answers NotFound, and the next failNext signals fail as a
// Temporal outage would.
type fakeWorkflows struct {
	mu       sync.Mutex
	reports  map[string][]Report
	attempts map[string]int
	gone     map[string]bool
	failNext int
}

func newFakeWorkflows() *fakeWorkflows {
	return &fakeWorkflows{reports: map[string][]Report{}, attempts: map[string]int{}, gone: map[string]bool{}}
}

func (f *fakeWorkflows) SignalWorkflow(_ context.Context, id, _, name string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[id]++
	switch {
	case name != contract.SignalMonitor:
		return serviceerror.NewInvalidArgument("unknown signal " + name)
	case f.gone[id]:
		return serviceerror.NewNotFound("workflow not found")
	case f.failNext > 0:
		f.failNext--
		return serviceerror.NewUnavailable("frontend unavailable")
	}
	f.reports[id] = append(f.reports[id], arg.(Report))
	return nil
}

// waitReports waits until id has n reports and returns them.
func (f *fakeWorkflows) waitReports(t *testing.T, id string, n int) []Report {
	t.Helper()
	var got []Report
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = append([]Report(nil), f.reports[id]...)
		return len(got) >= n
	}, 30*time.Second, 20*time.Millisecond, "%s: %d reports, want %d", id, len(got), n)
	return got
}

// ids returns the workflow IDs being watched.
func (ms *members) ids() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]string, 0, len(ms.byID))
	for id := range ms.byID {
		out = append(out, id)
	}
	return out
}

// ended reports whether the watch of workflowID has ended by itself (or never existed).
func (ms *members) ended(workflowID string) bool {
	ms.mu.Lock()
	m := ms.byID[workflowID]
	ms.mu.Unlock()
	if m == nil {
		return true
	}
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// TestShardMembersReportEachChange: a shard's watch of one proxy signals its workflow at
// each change and watches on (no new activity, no heartbeat); a report that fails is sent
// again, not lost; a new epoch replaces the watch, whose reports then carry it; and a memo
// withdrawn stops it.
func TestShardMembersReportEachChange(t *testing.T) {
	e := newTestEnv(t)
	in := e.input(t, "px-shard-1", Health{Known: true, Healthy: true})
	fw := newFakeWorkflows()
	ms := e.members(t, fw)
	ctx := t.Context()

	ms.sync(ctx, "wf-1", watch{&Memo{Epoch: "e1", Input: in}, "run"}, false)
	fw.mu.Lock()
	fw.failNext = 2
	fw.mu.Unlock()
	_, _, err := e.daemon.SetFault("px-shard-1", local.FaultAuth)
	require.NoError(t, err)
	got := fw.waitReports(t, "wf-1", 1)
	assert.Equal(t, "e1", got[0].Epoch)
	assert.Equal(t, ReasonVerdict, got[0].Result.Reason)
	assert.False(t, got[0].Result.Health.Healthy)

	_, _, err = e.daemon.SetFault("px-shard-1", local.FaultNone)
	require.NoError(t, err)
	got = fw.waitReports(t, "wf-1", 2)
	assert.True(t, got[1].Result.Health.Healthy, "the watch carried on after the first change")

	ms.sync(ctx, "wf-1", watch{&Memo{Epoch: "e1", Input: in}, "run"}, false) // the same epoch: no restart
	in.Last = got[1].Result.Health
	ms.sync(ctx, "wf-1", watch{&Memo{Epoch: "e2", Input: in}, "run"}, false)
	_, _, err = e.daemon.SetFault("px-shard-1", local.FaultAuth)
	require.NoError(t, err)
	got = fw.waitReports(t, "wf-1", 3)
	assert.Equal(t, "e2", got[2].Epoch)
	assert.False(t, got[2].Result.Health.Healthy)

	ms.sync(ctx, "wf-1", watch{run: "run"}, false)
	assert.Empty(t, ms.ids())
}

// TestShardMembersReportALostInstance: a killed instance is reported unhealthy, then (the
// watch asks the provider first thing after that verdict) stopped, and the watch ends: the
// workflow will publish a new epoch for the next instance.
func TestShardMembersReportALostInstance(t *testing.T) {
	e := newTestEnv(t)
	in := e.input(t, "px-shard-2", Health{Known: true, Healthy: true})
	fw := newFakeWorkflows()
	ms := e.members(t, fw)

	ms.sync(t.Context(), "wf-2", watch{&Memo{Epoch: "e1", Input: in}, "run"}, false)
	_, _, err := e.daemon.Kill("px-shard-2")
	require.NoError(t, err)
	got := fw.waitReports(t, "wf-2", 2)
	assert.Equal(t, ReasonVerdict, got[0].Result.Reason)
	assert.Equal(t, ReasonStopped, got[1].Result.Reason)
	require.Eventually(t, func() bool { return ms.ended("wf-2") }, 10*time.Second, 20*time.Millisecond, "the watch of a lost instance went on")
}

// TestShardMembersStopForAGoneWorkflow: a workflow that no longer exists ends the watch of
// its proxy after one attempt, instead of a report retried forever.
func TestShardMembersStopForAGoneWorkflow(t *testing.T) {
	e := newTestEnv(t)
	in := e.input(t, "px-shard-3", Health{})
	in.Instance = nil
	fw := newFakeWorkflows()
	fw.gone["wf-3"] = true
	ms := e.members(t, fw)

	// No verdict yet: the first one (healthy) comes after two probes and finds nobody.
	ms.sync(t.Context(), "wf-3", watch{&Memo{Epoch: "e1", Input: in}, "run"}, false)
	require.Eventually(t, func() bool { return ms.ended("wf-3") }, 30*time.Second, 20*time.Millisecond,
		"the watch of a gone workflow went on")
	fw.mu.Lock()
	defer fw.mu.Unlock()
	assert.Equal(t, 1, fw.attempts["wf-3"], "a gone workflow is not asked again")
}

// TestAMemberThatTakesOverChecksTheProvider: a member that starts from an unhealthy verdict
// in another process (its shard moved) asks the provider first, as a fresh one does: a
// lost instance is reported at once, not at the next drift check.
func TestAMemberThatTakesOverChecksTheProvider(t *testing.T) {
	e := newTestEnv(t)
	in := e.input(t, "px-shard-moved", Health{Known: true, Healthy: false, LastFailure: "connect: refused", Since: time.Now().Add(-time.Minute)})
	_, _, err := e.daemon.Kill("px-shard-moved")
	require.NoError(t, err)
	fw := newFakeWorkflows()
	ms := e.members(t, fw)

	ms.sync(t.Context(), "wf-moved", watch{&Memo{Epoch: "e1", Input: in}, "run"}, true)
	got := fw.waitReports(t, "wf-moved", 1)
	assert.Equal(t, ReasonStopped, got[0].Result.Reason)
}

// TestAMemberRetriesAWatchItCannotStart: a watch whose input cannot be watched (here, an
// instance at a provider the worker does not have) is tried again with backoff, neither
// given up nor tried in a tight loop, and reports nothing.
func TestAMemberRetriesAWatchItCannotStart(t *testing.T) {
	e := newTestEnv(t)
	in := e.input(t, "px-no-provider", Health{Known: true, Healthy: true})
	var mu sync.Mutex
	tries := 0
	e.env.Locate = func(InstanceInput) (provider.Provider, string, error) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		return nil, "", provider.ErrNotFound
	}
	fw := newFakeWorkflows()
	ms := e.members(t, fw)
	ms.sync(t.Context(), "wf-unwatchable", watch{&Memo{Epoch: "e1", Input: in}, "run"}, false)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tries >= 3
	}, 10*time.Second, 10*time.Millisecond, "the watch was not tried again")
	// 10 ms doubling: for the next 100 ms at most a handful of tries more, never thousands.
	assert.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tries >= 20
	}, 100*time.Millisecond, 5*time.Millisecond, "tried 20 times: a tight loop")
	assert.False(t, ms.ended("wf-unwatchable"), "an unwatchable input ended the member")
	fw.mu.Lock()
	defer fw.mu.Unlock()
	assert.Empty(t, fw.attempts)
}
