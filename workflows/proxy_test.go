package workflows

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// fakeProvider is an in-memory provider that records the order of operations, so tests can
// check make-before-break and exactly-once creation.
type fakeProvider struct {
	mu        sync.Mutex
	instances map[string]provider.Instance
	ops       []string
	// live counts instances after every operation once the first one exists.
	liveAfter []int
	// createErrs are returned by successive Create calls (nil: succeed). With
	// applyDespiteError the instance is created even when an error is returned, as when a
	// worker dies after the provider accepted the call.
	createErrs        []error
	applyDespiteError bool
	// createHook, if set, may refuse a create (e.g. during a simulated quota window).
	createHook func(name string) error
	// provisioningGets makes that many Gets report Provisioning before Running.
	provisioningGets int
	ip               int
}

var _ provider.Provider = (*fakeProvider)(nil)

func newFakeProvider() *fakeProvider {
	return &fakeProvider{instances: map[string]provider.Instance{}}
}

func (f *fakeProvider) record(op string) {
	f.ops = append(f.ops, op)
	if len(f.liveAfter) > 0 || len(f.instances) > 0 {
		f.liveAfter = append(f.liveAfter, len(f.instances))
	}
}

func (f *fakeProvider) ProviderID(req provider.CreateRequest) string { return "fake/" + req.Name }

func (f *fakeProvider) Create(_ context.Context, req provider.CreateRequest) (provider.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if len(f.createErrs) > 0 {
		err, f.createErrs = f.createErrs[0], f.createErrs[1:]
	}
	if err == nil && f.createHook != nil {
		err = f.createHook(req.Name)
	}
	if err != nil && !f.applyDespiteError {
		f.ops = append(f.ops, "create-failed "+req.Name)
		return provider.Instance{}, err
	}
	inst, exists := f.instances[req.Name]
	if !exists {
		f.ip++
		inst = provider.Instance{
			Name: req.Name, ProviderID: f.ProviderID(req), State: provider.StateProvisioning,
			Labels: req.Labels(),
		}
		f.instances[req.Name] = inst
		f.record("create " + req.Name)
	}
	if err != nil {
		return provider.Instance{}, err
	}
	return inst, nil
}

func (f *fakeProvider) Get(_ context.Context, id string) (provider.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := strings.TrimPrefix(id, "fake/")
	inst, ok := f.instances[name]
	if !ok {
		return provider.Instance{}, provider.ErrNotFound
	}
	if f.provisioningGets > 0 {
		f.provisioningGets--
		return inst, nil
	}
	inst.State, inst.IP, inst.Port = provider.StateRunning, "127.0.0.1", 3128
	f.instances[name] = inst
	return inst, nil
}

func (f *fakeProvider) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := strings.TrimPrefix(id, "fake/")
	if _, ok := f.instances[name]; ok {
		delete(f.instances, name)
		f.record("delete " + name)
	}
	return nil
}

func (f *fakeProvider) ListOwned(_ context.Context, owner provider.Owner) ([]provider.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []provider.Instance
	for _, name := range slices.Sorted(maps.Keys(f.instances)) {
		if inst := f.instances[name]; owner.Owns(inst.Labels) {
			out = append(out, inst)
		}
	}
	return out, nil
}

func (f *fakeProvider) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.instances {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (f *fakeProvider) opIndex(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range f.ops {
		if o == op {
			return i
		}
	}
	return -1
}

// harness runs ProxyWorkflow in the SDK's test environment with the real provider
// activities over fakeProvider; status publishing, Secret hashing and probing are mocked
// because they need a cluster or a network.
type harness struct {
	testsuite.WorkflowTestSuite
	t    *testing.T
	env  *testsuite.TestWorkflowEnvironment
	prov *fakeProvider
	uid  string
	// rec counts what each run asks of the server and keeps the last memo; start is the
	// test clock's time when the harness was built.
	rec   *recorder
	start time.Time
	// reg is the worker's provider registry; a test may take a provider away (a worker that
	// lacks it) and put it back.
	reg provider.Registry
	// apiDown makes the Kubernetes API refuse status writes and finalizer releases.
	apiDown bool

	mu       sync.Mutex
	statuses []v1alpha1.ProxyStatus
	released int
	// healthy is the verdict mocked monitors report (a first verdict only: later monitors
	// block until cancelled, as a stable proxy's monitor does).
	healthy      bool
	monitorCalls int
	// shard stands in for the monitor shard that watches the proxy (version 4 on).
	shard shardSim
	// checks counts scheduled checks; ran counts those that ran (a check that never runs
	// would let a test pass without asserting anything).
	checks, ran int
}

// checkAt runs fn at workflow time d.
func (h *harness) checkAt(d time.Duration, fn func()) {
	h.checks++
	h.env.RegisterDelayedCallback(func() { h.ran++; fn() }, d)
}

// newHarness builds the environment; mocks registered by first take precedence over the
// defaults (testify matches expectations in the order they were added).
func newHarness(t *testing.T, first ...func(*harness)) *harness {
	h := &harness{t: t, prov: newFakeProvider(), uid: "uid-1", healthy: true, rec: &recorder{}}
	h.env = h.NewTestWorkflowEnvironment()
	h.env.SetTestTimeout(30 * time.Second)
	h.env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{h.rec}})
	h.start = h.env.Now()
	h.reg = provider.Registry{v1alpha1.ProviderLocal: h.prov}
	acts := &activities.Activities{Providers: h.reg, Installation: "test", Keyring: testKeys}
	h.env.RegisterActivity(acts)
	for _, f := range first {
		f(h)
	}
	h.env.OnActivity(acts.PublishStatus, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.PublishInput) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.apiDown {
			return errAPIDown
		}
		h.statuses = append(h.statuses, in.Status)
		return nil
	})
	h.env.OnActivity(acts.ReleaseFinalizer, mock.Anything, mock.Anything).Return(func(context.Context, activities.ObjectRef) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.apiDown {
			return errAPIDown
		}
		h.released++
		return nil
	})
	h.env.OnActivity(acts.HashCloudInit, mock.Anything, mock.Anything).Return("secret-hash-1", nil)
	// A monitor with news returns at once; one without blocks (in workflow time, so the
	// test clock can skip ahead) until the workflow cancels it, as a stable proxy's does.
	needsVerdict := func(in activities.MonitorInput) bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return !in.Last.Known || in.Last.Healthy != h.healthy
	}
	h.env.OnActivity(acts.Monitor, mock.Anything, mock.MatchedBy(needsVerdict)).Return(func(ctx context.Context, in activities.MonitorInput) (activities.MonitorResult, error) {
		return h.verdict(), nil
	})
	h.env.OnActivity(acts.Monitor, mock.Anything, mock.MatchedBy(func(in activities.MonitorInput) bool { return !needsVerdict(in) })).
		After(1000*time.Hour).Return(activities.MonitorResult{}, nil)
	// The shard's member behaves as the mocked Monitor does: news at once, else nothing.
	h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
		if !needsVerdict(in) {
			return activities.MonitorResult{}, 0, false
		}
		return h.verdict(), 0, true
	})
	h.rec.onWatch = h.watchChanged
	return h
}

// verdict is what the mocked monitors find: the harness's health, counted.
func (h *harness) verdict() activities.MonitorResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.monitorCalls++
	health := activities.Health{Known: true, Healthy: h.healthy, LatencyMillis: 12}
	if !h.healthy {
		health.LastFailure = "connect: refused"
	}
	return activities.MonitorResult{Reason: activities.MonitorVerdict, Health: health}
}

// shardSim is the monitor shard of the test environment. It follows the MonitorMemo the
// run publishes as a shard's member does: a new epoch starts a new watch, the same epoch
// keeps the running one, none stops it. What the watch finds, and when, comes from models
// (the first that has something to say wins); each report is signalled to the workflow,
// and the watch goes on from the verdict it reported, until the instance is lost.
type shardSim struct {
	models []func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool)
	// gen numbers the watches; a pending report of an earlier one is dropped, as a
	// cancelled member's would be.
	gen   int
	epoch string
	// reports counts what was signalled; published is every watch the run published, in
	// order (nil: it removed its watch).
	reports   int
	published []*activities.MonitorMemo
}

// lastWatch is the watch the run published last.
func (h *harness) lastWatch() *activities.MonitorMemo {
	h.t.Helper()
	require.NotEmpty(h.t, h.shard.published, "no watch was published")
	return h.shard.published[len(h.shard.published)-1]
}

func (h *harness) watchChanged(m *activities.MonitorMemo) {
	sh := &h.shard
	sh.published = append(sh.published, m)
	if m != nil && sh.epoch == m.Epoch {
		return
	}
	sh.gen++
	sh.epoch = ""
	if m == nil {
		return
	}
	sh.epoch = m.Epoch
	h.nextReport(sh.gen, m.Epoch, m.Input)
}

func (h *harness) nextReport(gen int, epoch string, in activities.MonitorInput) {
	for _, model := range h.shard.models {
		res, after, ok := model(in)
		if !ok {
			continue
		}
		h.env.RegisterDelayedCallback(func() {
			if h.shard.gen != gen || h.env.IsWorkflowCompleted() {
				return
			}
			h.shard.reports++
			h.env.SignalWorkflow(contract.SignalMonitor, activities.MonitorReport{Epoch: epoch, Result: res})
			if res.Reason == activities.MonitorGone || res.Reason == activities.MonitorStopped {
				return
			}
			in.Last = res.Health
			h.nextReport(gen, epoch, in)
		}, after)
		return
	}
}

func (h *harness) spec(mut ...func(*v1alpha1.ProxySpec)) v1alpha1.ProxySpec {
	s := v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
		HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "10s", Timeout: "5s", SuccessThreshold: 2, FailureThreshold: 3, ExpectedStatus: 200},
		MaxLeases:   4,
	}
	for _, m := range mut {
		m(&s)
	}
	return s
}

func (h *harness) signalAt(d time.Duration, name string, arg any) {
	h.env.RegisterDelayedCallback(func() { h.env.SignalWorkflow(name, arg) }, d)
}

func (h *harness) specAt(d time.Duration, gen int64, spec v1alpha1.ProxySpec) {
	h.signalAt(d, contract.SignalSpec, SpecSignal{UID: h.uid, Generation: gen, Spec: spec})
}

func (h *harness) run(tuning Tuning) {
	h.runInput(ProxyWorkflowInput{Namespace: "ns", Name: "p", Installation: "test", Tuning: tuning})
}

func (h *harness) runInput(in ProxyWorkflowInput) {
	h.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: contract.ProxyWorkflowID("ns", "p")})
	h.env.ExecuteWorkflow(ProxyWorkflow, in)
}

func fastTuning() Tuning {
	return Tuning{PollInterval: time.Millisecond, RetryBase: time.Second, RetryMax: time.Minute, QuotaRetry: 5 * time.Minute}
}

func (h *harness) phases() []v1alpha1.Phase {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []v1alpha1.Phase
	for _, s := range h.statuses {
		if len(out) == 0 || out[len(out)-1] != s.Phase {
			out = append(out, s.Phase)
		}
	}
	return out
}

func (h *harness) lastStatus() v1alpha1.ProxyStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(h.t, h.statuses, "no status was published")
	return h.statuses[len(h.statuses)-1]
}

// statusWhere returns the first published status satisfying ok.
func (h *harness) statusWhere(ok func(v1alpha1.ProxyStatus) bool) (v1alpha1.ProxyStatus, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.statuses {
		if ok(s) {
			return s, true
		}
	}
	return v1alpha1.ProxyStatus{}, false
}

func condition(s v1alpha1.ProxyStatus, typ string) metav1.Condition {
	c := meta.FindStatusCondition(s.Conditions, typ)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

func (h *harness) requireCompleted() {
	h.t.Helper()
	require.True(h.t, h.env.IsWorkflowCompleted(), "workflow did not complete")
	assert.Equal(h.t, h.checks, h.ran, "some checks never ran")
	err := h.env.GetWorkflowError()
	var panicErr *temporal.PanicError
	if errors.As(err, &panicErr) {
		h.t.Fatalf("workflow panicked: %v\n%s", panicErr, panicErr.StackTrace())
	}
	require.NoError(h.t, err)
}

func TestFirstCreateThenDelete(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(30*time.Minute, func() {
		// While steady: Ready, provisioned with the instance's address.
		s := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseReady, s.Phase)
		assert.Equal(t, "127.0.0.1", s.IP)
		assert.Equal(t, int32(3128), s.Port)
		assert.Equal(t, InstanceName(h.uid, 1), s.InstanceName)
		assert.Equal(t, metav1.ConditionTrue, condition(s, v1alpha1.ConditionProvisioned).Status)
		assert.Equal(t, metav1.ConditionTrue, condition(s, v1alpha1.ConditionReady).Status)
		assert.Equal(t, int64(1), s.ObservedGeneration)
		assert.Equal(t, contract.ProxyWorkflowID("ns", "p"), s.WorkflowID)
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names())

		v, err := h.env.QueryWorkflow(contract.QueryState)
		require.NoError(t, err)
		var st ProxyState
		require.NoError(t, v.Get(&st))
		assert.Equal(t, v1alpha1.PhaseReady, st.Phase)
		assert.True(t, st.Instance.Running())
	})
	h.run(fastTuning())

	h.requireCompleted()
	assert.Empty(t, h.prov.names(), "instance left behind after delete")
	assert.Equal(t, 1, h.released, "finalizer released once")
	assert.Equal(t, []v1alpha1.Phase{v1alpha1.PhasePending, v1alpha1.PhaseProvisioning, v1alpha1.PhaseReady, v1alpha1.PhaseDeleting}, h.phases())
}

func TestAdoptAfterCrash(t *testing.T) {
	h := newHarness(t)
	// The provider accepts the first create but the worker "dies" before recording it;
	// the retry finds the instance already there and adopts it.
	h.prov.createErrs = []error{errors.New("worker lost")}
	h.prov.applyDespiteError = true
	h.specAt(0, 1, h.spec())
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names(), "exactly one instance")
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
	})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Empty(t, h.prov.names())
}

// makeBeforeBreak checks that the replacement was created before the old instance was
// deleted and that the proxy never had zero instances in between.
func (h *harness) makeBeforeBreak(oldN, newN int) {
	h.t.Helper()
	create := h.prov.opIndex("create " + InstanceName(h.uid, newN))
	del := h.prov.opIndex("delete " + InstanceName(h.uid, oldN))
	require.GreaterOrEqual(h.t, create, 0, "replacement never created: %v", h.prov.ops)
	require.GreaterOrEqual(h.t, del, 0, "old instance never deleted: %v", h.prov.ops)
	assert.Less(h.t, create, del, "replacement must be created before the old instance is deleted: %v", h.prov.ops)
	for i, n := range h.prov.liveAfter[:del] {
		assert.Positive(h.t, n, "no instance after op %d (%v)", i, h.prov.ops)
	}
}

func TestSpecChangeReplacesMakeBeforeBreak(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.specAt(20*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) { s.Port = 8080 }))
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(40*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names())
		s := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseReady, s.Phase)
		assert.Equal(t, int32(1), s.Replacements)
		assert.Equal(t, int64(2), s.ObservedGeneration)
		assert.Equal(t, InstanceName(h.uid, 2), s.InstanceName)
	})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
	assert.Contains(t, h.phases(), v1alpha1.PhaseReplacing)
}

func TestAttributeChangeDoesNotReplace(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.specAt(20*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
		s.MaxLeases = 9
	}))
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1), "delete " + InstanceName(h.uid, 1)}, h.prov.ops)
}

func TestReplaceSignal(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
}

func TestMaxAgeReplaces(t *testing.T) {
	h := newHarness(t)
	maxAge := v1alpha1.Duration("10m")
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) { s.Lifecycle = &v1alpha1.Lifecycle{MaxAge: &maxAge} }))
	h.checkAt(9*time.Minute, func() {
		// Before maxAge: still the first instance.
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names())
	})
	h.checkAt(15*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names(), "replaced once maxAge passed")
	})
	h.signalAt(16*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
}

func TestDeleteWhileProvisioning(t *testing.T) {
	h := newHarness(t)
	acts := &activities.Activities{}
	// The instance never gets an address; the wait is long.
	h.env.OnActivity(acts.WaitRunning, mock.Anything, mock.Anything).After(time.Hour).Return(activities.WaitResult{}, nil)
	h.specAt(0, 1, h.spec())
	h.signalAt(5*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1), "delete " + InstanceName(h.uid, 1)}, h.prov.ops)
	assert.Empty(t, h.prov.names())
	assert.Equal(t, 1, h.released)
}

func TestExternalModeMakesNoProviderCalls(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "proxy.partner.example", Port: 8080},
		HealthCheck: h.spec().HealthCheck, MaxLeases: 4,
	})
	h.signalAt(10*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(30*time.Minute, func() {
		s := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseReady, s.Phase)
		assert.Equal(t, "proxy.partner.example", s.IP)
		assert.Equal(t, int32(8080), s.Port)
		assert.Equal(t, v1alpha1.ReasonExternalEndpoint, condition(s, v1alpha1.ConditionProvisioned).Reason)
	})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Empty(t, h.prov.ops, "External proxies must never reach a provider")
	assert.Equal(t, 1, h.released)
}

func TestQuotaIsAWaitNotAFailure(t *testing.T) {
	h := newHarness(t)
	quota := provider.QuotaError(errors.New("quota CPUS exceeded in us-central1"))
	h.prov.createErrs = []error{quota, quota}
	h.specAt(0, 1, h.spec())
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()

	s, ok := h.statusWhere(func(s v1alpha1.ProxyStatus) bool {
		return condition(s, v1alpha1.ConditionQuotaExceeded).Status == metav1.ConditionTrue
	})
	require.True(t, ok, "QuotaExceeded=True was never published")
	assert.Contains(t, condition(s, v1alpha1.ConditionQuotaExceeded).Message, "quota CPUS exceeded")
	assert.Equal(t, v1alpha1.PhaseProvisioning, s.Phase)
	assert.NotContains(t, h.phases(), v1alpha1.PhaseFailed)
	assert.Contains(t, h.phases(), v1alpha1.PhaseReady, "provisioned once quota was available")
	assert.Equal(t, []string{"create-failed " + InstanceName(h.uid, 1), "create-failed " + InstanceName(h.uid, 1),
		"create " + InstanceName(h.uid, 1), "delete " + InstanceName(h.uid, 1)}, h.prov.ops,
		"quota retries reuse the same instance name")
}

func TestPermanentErrorLatchesUntilNewGeneration(t *testing.T) {
	h := newHarness(t)
	h.prov.createErrs = []error{provider.Permanent(errors.New("machine type e2-nope does not exist"))}
	h.specAt(0, 1, h.spec())
	h.checkAt(30*time.Minute, func() {
		s := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseFailed, s.Phase)
		assert.Equal(t, v1alpha1.ReasonPermanentError, condition(s, v1alpha1.ConditionProvisioned).Reason)
		assert.Contains(t, condition(s, v1alpha1.ConditionProvisioned).Message, "e2-nope")
		assert.Empty(t, h.prov.names())
	})
	// The same generation again (a controller restart) does not retry.
	h.specAt(31*time.Minute, 1, h.spec())
	h.checkAt(40*time.Minute, func() {
		assert.Equal(t, v1alpha1.PhaseFailed, h.lastStatus().Phase)
	})
	h.specAt(45*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) { s.Port = 3129 }))
	h.checkAt(55*time.Minute, func() {
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase, "a new generation recovers")
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	creates := 0
	for _, op := range h.prov.ops {
		if strings.HasPrefix(op, "create") {
			creates++
		}
	}
	assert.Equal(t, 2, creates, "one failed create, one after the new generation: %v", h.prov.ops)
}

func TestStaleGenerationIgnored(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 2, h.spec())
	h.specAt(10*time.Minute, 1, h.spec(func(s *v1alpha1.ProxySpec) { s.Port = 9999 }))
	h.specAt(11*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) { s.Port = 9999 }))
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, int32(3128), h.lastStatus().Port)
		assert.Equal(t, int64(2), h.lastStatus().ObservedGeneration)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1), "delete " + InstanceName(h.uid, 1)}, h.prov.ops)
}

func TestDeleteForOtherUIDIgnored(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.signalAt(10*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: "someone-else"})
	h.checkAt(20*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names())
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}

func TestContinueAsNewKeepsState(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	// History grows past the limit while steady; the next event makes the workflow continue
	// as new, with the attribute change of that event applied first.
	h.env.RegisterDelayedCallback(func() { h.env.SetCurrentHistoryLength(500) }, 19*time.Minute)
	h.specAt(20*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
	}))
	tuning := fastTuning()
	tuning.HistoryLimit = 400
	h.run(tuning)

	require.True(t, h.env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, h.env.GetWorkflowError(), &can, "expected continue-as-new")
	var next ProxyWorkflowInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(t, next.State)
	assert.Equal(t, h.uid, next.State.UID)
	require.NotNil(t, next.State.Instance)
	assert.Equal(t, InstanceName(h.uid, 1), next.State.Instance.Name)
	assert.True(t, next.State.Instance.Running())
	assert.True(t, next.State.Health.Known && next.State.Health.Healthy, "verdict carried, so the next run does not flap")
	assert.Equal(t, tuning, next.Tuning)
	assert.Equal(t, int64(2), next.State.Generation)
	assert.Equal(t, v1alpha1.AttributeValue("eu"), next.State.Spec.Attributes["region"])

	// The next run picks up where this one stopped: no new instance, straight to steady.
	h2 := newHarness(t)
	h2.prov = h.prov
	acts := &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderLocal: h.prov}, Installation: "test", Keyring: testKeys}
	h2.env.RegisterActivity(acts)
	h2.signalAt(10*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	next.Tuning.HistoryLimit = 0
	h2.env.ExecuteWorkflow(ProxyWorkflow, next)
	h2.requireCompleted()
	require.NotNil(t, h2.shard.published[0])
	assert.Equal(t, h.lastWatch().Epoch, h2.shard.published[0].Epoch, "the next run publishes the same watch, so its shard watches on")
	assert.Zero(t, h2.shard.reports, "the verdict carried over needs no new one")
	assert.Equal(t, 1, strings.Count(strings.Join(h.prov.ops, ","), "create "), "no second create after continue-as-new: %v", h.prov.ops)
	assert.Empty(t, h.prov.names())
}

func TestUnhealthyVerdictPublished(t *testing.T) {
	h := newHarness(t)
	h.healthy = false
	h.specAt(0, 1, h.spec())
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(30*time.Minute, func() {
		s := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseUnhealthy, s.Phase)
		assert.Equal(t, metav1.ConditionFalse, condition(s, v1alpha1.ConditionHealthy).Status)
		assert.Equal(t, "connect: refused", condition(s, v1alpha1.ConditionHealthy).Message)
		assert.Equal(t, metav1.ConditionFalse, condition(s, v1alpha1.ConditionReady).Status)
	})
	h.run(fastTuning())
	h.requireCompleted()
}

func TestUnhealthyReplacedAfterGrace(t *testing.T) {
	h := newHarness(t)
	h.healthy = false
	grace := v1alpha1.Duration("5m")
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: &grace}
	}))
	h.checkAt(4*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names(), "not before the grace")
		assert.Equal(t, v1alpha1.PhaseUnhealthy, h.lastStatus().Phase)
	})
	h.checkAt(7*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names(), "replaced once unhealthy for the grace")
	})
	h.signalAt(8*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
}

func TestUnhealthyWithoutGraceIsNotReplaced(t *testing.T) {
	h := newHarness(t)
	h.healthy = false
	h.specAt(0, 1, h.spec())
	h.signalAt(3*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1), "delete " + InstanceName(h.uid, 1)}, h.prov.ops)
}

// firstInstanceLost makes the first instance's steady monitor report lost (once), after a
// while.
func firstInstanceLost(lost activities.MonitorResult) func(*harness) {
	first := true
	return func(h *harness) {
		// The loss is due 15 minutes after the first verdict, however often the watch
		// restarts meanwhile.
		var lostAt time.Time
		h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
			if in.Instance == nil || in.Instance.Name != InstanceName(h.uid, 1) || !in.Last.Known {
				return activities.MonitorResult{}, 0, false
			}
			if lostAt.IsZero() {
				lostAt = h.env.Now().Add(15 * time.Minute)
			}
			return lost, max(lostAt.Sub(h.env.Now()), 0), true
		})
		acts := &activities.Activities{}
		h.env.OnActivity(acts.Monitor, mock.Anything, mock.MatchedBy(func(in activities.MonitorInput) bool {
			return in.Instance != nil && in.Instance.Name == InstanceName(h.uid, 1) && in.Last.Known
		})).After(15 * time.Minute).Return(func(context.Context, activities.MonitorInput) (activities.MonitorResult, error) {
			if first {
				first = false
				return lost, nil
			}
			return activities.MonitorResult{}, nil
		})
	}
}

// runRecreated runs a harness whose first instance gets lost: by 40 minutes the second
// instance serves, alone; the Proxy is then deleted.
func (h *harness) runRecreated() {
	h.checkAt(40*time.Minute, func() {
		assert.Equal(h.t, []string{InstanceName(h.uid, 2)}, h.prov.names())
		assert.Equal(h.t, v1alpha1.PhaseReady, h.lastStatus().Phase)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}

// TestLostInstanceIsRecreated: the monitor reports the instance gone; the workflow deletes
// what is left of it and creates a new one, showing Unhealthy meanwhile.
func TestLostInstanceIsRecreated(t *testing.T) {
	h := newHarness(t, firstInstanceLost(activities.MonitorResult{Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}}))
	h.specAt(0, 1, h.spec())
	h.checkAt(10*time.Minute, func() {
		// The VM vanished behind our back.
		require.NoError(t, h.prov.Delete(context.Background(), "fake/"+InstanceName(h.uid, 1)))
	})
	h.runRecreated()
	assert.Contains(t, h.phases(), v1alpha1.PhaseUnhealthy, "a lost instance shows as Unhealthy while it is recreated")
}

// TestPreemptedInstanceIsReplacedFirst: the monitor finds the Spot VM preempted; the
// workflow creates the next instance before it deletes the stopped one (make-before-break
// is impossible: the old one serves nobody), and the status says preempted meanwhile.
func TestPreemptedInstanceIsReplacedFirst(t *testing.T) {
	h := newHarness(t, firstInstanceLost(activities.MonitorResult{Reason: activities.MonitorStopped, Health: activities.Health{Known: true, Healthy: true},
		Instance: provider.Instance{State: provider.StateStopped, Preempted: true}}))
	h.specAt(0, 1, h.spec())
	h.runRecreated()
	assert.Equal(t, []string{"create " + InstanceName(h.uid, 1), "create " + InstanceName(h.uid, 2), "delete " + InstanceName(h.uid, 1),
		"delete " + InstanceName(h.uid, 2)}, h.prov.ops, "the next instance is created before the preempted one is deleted")
	st, ok := h.statusWhere(func(s v1alpha1.ProxyStatus) bool {
		c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionHealthy)
		return c != nil && c.Reason == v1alpha1.ReasonPreempted
	})
	require.True(t, ok, "no status said the instance was preempted")
	assert.Equal(t, v1alpha1.PhaseUnhealthy, st.Phase)
}

// memo is the last memo the workflow published.
func (h *harness) memo() contract.ProxyMemo { return h.rec.lastMemo() }

var errAPIDown = errors.New("connect: connection refused (kube-apiserver down)")

// setAPIDown takes the Kubernetes API down or brings it back.
func (h *harness) setAPIDown(down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.apiDown = down
}

func permanentErr(msg string) error { return provider.Permanent(errors.New(msg)) }

func (h *harness) queryState() ProxyState {
	h.t.Helper()
	v, err := h.env.QueryWorkflow(contract.QueryState)
	require.NoError(h.t, err)
	var st ProxyState
	require.NoError(h.t, v.Get(&st))
	return st
}

func TestReportsKeepCooldownsAndReplaceWhenBannedWidely(t *testing.T) {
	h := newHarness(t)
	two := int32(2)
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: &two}
	}))
	h.signalAt(10*time.Minute, contract.SignalReport, contract.ReportSignal{Target: "shop.example", Result: contract.ReportRateLimited})
	h.signalAt(11*time.Minute, contract.SignalReport, contract.ReportSignal{Target: "news.example", Result: contract.ReportBanned})
	h.checkAt(12*time.Minute, func() {
		st := h.queryState()
		assert.Len(t, st.Cooldowns, 2, "both targets cool down")
		assert.Len(t, st.Bans, 1, "rate limits are not bans")
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names(), "one ban is below the limit")
		assert.Equal(t, int32(0), h.lastStatus().Replacements)
	})
	h.signalAt(13*time.Minute, contract.SignalReport, contract.ReportSignal{Target: "shop.example", Result: contract.ReportBanned})
	h.checkAt(20*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 2)}, h.prov.names(), "banned on 2 targets: replaced")
		st := h.queryState()
		assert.Empty(t, st.Cooldowns, "a new address starts clean")
		assert.Empty(t, st.Bans)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(1, 2)
}

func TestCooldownsExpireAndBansAgeOut(t *testing.T) {
	h := newHarness(t)
	two := int32(2)
	window := v1alpha1.Duration("5m")
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: &two, BanWindow: &window}
	}))
	h.checkAt(10*time.Minute, func() {})
	h.env.RegisterDelayedCallback(func() {
		h.env.SignalWorkflow(contract.SignalReport, contract.ReportSignal{Target: "a.example", Result: contract.ReportBanned, Until: h.env.Now().Add(2 * time.Minute)})
	}, 10*time.Minute)
	// The second ban comes after the first left the window: no replacement.
	h.signalAt(20*time.Minute, contract.SignalReport, contract.ReportSignal{Target: "b.example", Result: contract.ReportBanned})
	h.checkAt(21*time.Minute, func() {
		st := h.queryState()
		assert.Len(t, st.Bans, 1)
		_, stillCooling := st.Cooldowns["a.example"]
		assert.False(t, stillCooling, "a.example's cooldown ended at its until")
		assert.Equal(t, []string{InstanceName(h.uid, 1)}, h.prov.names())
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}
