package controller_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}

// flakyTemporal is the real client behind a switch: while down, every call fails as an
// unreachable server would. It records the spec signals that got through.
type flakyTemporal struct {
	real client.Client
	mu   sync.Mutex
	down bool
	sent []sentSignal
}

// sentSignal is a spec signal and the workflow it went to: the manager reconciles every
// namespace's Proxies, other tests' included, so a test reads its own Proxy's signals.
type sentSignal struct {
	id  string
	sig proxyinput.SpecSignal
}

var _ controller.Temporal = (*flakyTemporal)(nil)

var errUnreachable = errors.New("connection refused (test: Temporal is down)")

func (f *flakyTemporal) isDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

func (f *flakyTemporal) setDown(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = v
}

// signals are those sent to workflow id, in order.
func (f *flakyTemporal) signals(id string) []proxyinput.SpecSignal {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []proxyinput.SpecSignal
	for _, s := range f.sent {
		if s.id == id {
			out = append(out, s.sig)
		}
	}
	return out
}

func (f *flakyTemporal) SignalWithStartWorkflow(ctx context.Context, id, name string, arg any, opts client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	if f.isDown() {
		return nil, errUnreachable
	}
	run, err := f.real.SignalWithStartWorkflow(ctx, id, name, arg, opts, wf, args...)
	if sig, ok := arg.(proxyinput.SpecSignal); ok && err == nil {
		f.mu.Lock()
		f.sent = append(f.sent, sentSignal{id: id, sig: sig})
		f.mu.Unlock()
	}
	return run, err
}

func (f *flakyTemporal) SignalWorkflow(ctx context.Context, id, runID, name string, arg any) error {
	if f.isDown() {
		return errUnreachable
	}
	return f.real.SignalWorkflow(ctx, id, runID, name, arg)
}

func (f *flakyTemporal) DescribeWorkflow(ctx context.Context, id, runID string) (*client.WorkflowExecutionDescription, error) {
	if f.isDown() {
		return nil, errUnreachable
	}
	return f.real.DescribeWorkflow(ctx, id, runID)
}

func (f *flakyTemporal) ListWorkflow(ctx context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	if f.isDown() {
		return nil, errUnreachable
	}
	return f.real.ListWorkflow(ctx, req)
}

// testManager builds a quiet manager on the shared test cluster, with no metrics or probe
// servers; several run in one test binary.
func testManager(t *testing.T) manager.Manager {
	t.Helper()
	k := testenv.Kube(t)
	mgr, err := ctrl.NewManager(k.Config, ctrl.Options{
		Scheme: k.Scheme, Cache: controller.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Logger:     logr.Discard(),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	return mgr
}

// startController runs the reconciler in a manager. No worker serves its task queue: the
// tests look only at what the controller hands to Temporal. The periodic resync is not
// added: tests call Resync on the returned reconciler when they want a pass.
func startController(t *testing.T, tc controller.Temporal) *controller.ProxyReconciler {
	t.Helper()
	mgr := testManager(t)
	ctx, cancel := context.WithCancel(context.Background())
	r := &controller.ProxyReconciler{
		Client: mgr.GetClient(), Temporal: tc, Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Installation: "test", TaskQueue: "controller-test-no-worker", RecheckDeleting: time.Second,
	}
	require.NoError(t, r.SetupWithManager(ctx, mgr))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return r
}

// namespace creates a namespace for one test. When the test ends its Proxies are deleted
// (finalizers dropped) and their workflows terminated: envtest has no namespace controller,
// and a live Proxy left behind would be found by later tests' resync passes.
func namespace(t *testing.T) string {
	t.Helper()
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ctrl-"}}
	require.NoError(t, k.Client.Create(ctx, ns))
	t.Cleanup(func() {
		var list v1alpha1.ProxyList
		if err := k.Client.List(ctx, &list, ctrlclient.InNamespace(ns.Name)); err != nil {
			t.Logf("clean up namespace %s: %v", ns.Name, err)
			return
		}
		dropFinalizers := ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		for i := range list.Items {
			p := &list.Items[i]
			_ = k.Client.Delete(ctx, p)
			_ = k.Client.Patch(ctx, p, dropFinalizers)
			_ = testenv.Temporal(t).Client.TerminateWorkflow(ctx, contract.ProxyWorkflowID(p.Namespace, p.Name), "", "test done")
		}
	})
	return ns.Name
}

func proxy(ns, name string) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{
			Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
			HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
		},
	}
}

// TestTemporalOutageLosesNothing: while Temporal is unreachable the controller records a
// Warning event and retries; once it is back, the Proxy's spec reaches its workflow.
func TestTemporalOutageLosesNothing(t *testing.T) {
	k := testenv.Kube(t)
	tc := &flakyTemporal{real: testenv.Temporal(t).Client, down: true}
	startController(t, tc)
	ctx := context.Background()
	ns := namespace(t)
	p := proxy(ns, "outage")
	require.NoError(t, k.Client.Create(ctx, p))

	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		if err := k.Client.List(ctx, &list, ctrlclient.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == controller.EventTemporalUnavailable && e.Type == corev1.EventTypeWarning && e.Regarding.Name == "outage" {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "no Warning event while Temporal was down")

	tc.setDown(false)
	id := contract.ProxyWorkflowID(ns, "outage")
	// The stand-in notes a signal once the call has returned, which can be after the
	// server already shows the workflow: both are waited for.
	require.Eventually(t, func() bool {
		_, err := testenv.Temporal(t).Client.DescribeWorkflow(ctx, id, "")
		return err == nil && len(tc.signals(id)) > 0
	}, time.Minute, 100*time.Millisecond, "the workflow was never started after Temporal came back")
	sig := tc.signals(id)
	assert.Equal(t, string(p.UID), sig[0].UID)
	assert.Equal(t, p.Generation, sig[0].Generation)

	var got v1alpha1.Proxy
	require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "outage"}, &got))
	assert.Contains(t, got.Finalizers, v1alpha1.Finalizer, "finalizer added before anything can be created")
	_ = testenv.Temporal(t).Client.TerminateWorkflow(ctx, id, "", "test done")
}

// TestSecretRotationSignalsAgain: a change to a labelled cloud-init Secret re-sends the spec
// with the Secret's new version (never its data), although the Proxy did not change.
func TestSecretRotationSignalsAgain(t *testing.T) {
	k := testenv.Kube(t)
	tc := &flakyTemporal{real: testenv.Temporal(t).Client}
	startController(t, tc)
	ctx := context.Background()
	ns := namespace(t)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		StringData: map[string]string{"script": "v1"},
	}
	require.NoError(t, k.Client.Create(ctx, secret))
	p := proxy(ns, "rotating")
	p.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "script"}}
	require.NoError(t, k.Client.Create(ctx, p))
	// The first signal may carry "" when the Proxy is reconciled before the Secret reaches
	// the cache; the workflow reads the Secret itself either way.
	id := contract.ProxyWorkflowID(ns, "rotating")
	require.Eventually(t, func() bool { return len(tc.signals(id)) > 0 }, 30*time.Second, 50*time.Millisecond, "no signal sent")

	secret.StringData = map[string]string{"script": "v2"}
	require.NoError(t, k.Client.Update(ctx, secret))
	require.Eventually(t, func() bool {
		s := tc.signals(id)
		return len(s) > 0 && s[len(s)-1].SecretVersion == secret.ResourceVersion
	}, 30*time.Second, 50*time.Millisecond, "rotation should re-send the spec")
	last := tc.signals(id)[len(tc.signals(id))-1]
	assert.Equal(t, p.Generation, last.Generation, "same generation: only the Secret changed")
	_ = testenv.Temporal(t).Client.TerminateWorkflow(ctx, id, "", "test done")
}

// TestDeleteWithoutWorkflowReleases: a Proxy whose workflow never existed (nothing was ever
// created for it) is released at once.
func TestDeleteWithoutWorkflowReleases(t *testing.T) {
	k := testenv.Kube(t)
	tc := &flakyTemporal{real: testenv.Temporal(t).Client, down: true}
	startController(t, tc)
	ctx := context.Background()
	ns := namespace(t)
	p := proxy(ns, "never-started")
	p.Finalizers = []string{v1alpha1.Finalizer}
	require.NoError(t, k.Client.Create(ctx, p))
	require.NoError(t, k.Client.Delete(ctx, p))
	// While Temporal is down the finalizer stays: the controller cannot know yet.
	require.Never(t, func() bool {
		var got v1alpha1.Proxy
		return k.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "never-started"}, &got) != nil
	}, 2*time.Second, 100*time.Millisecond, "released while Temporal could not confirm")
	tc.setDown(false)
	require.Eventually(t, func() bool {
		var got v1alpha1.Proxy
		err := k.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "never-started"}, &got)
		return ctrlclient.IgnoreNotFound(err) == nil && err != nil
	}, 30*time.Second, 50*time.Millisecond, "finalizer never released")
}
