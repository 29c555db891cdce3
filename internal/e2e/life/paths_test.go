package life

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// The tests in this file drive ProxyWorkflows directly on the dev server, with the stack's
// real worker and providers, through paths a Proxy object cannot take in seconds (the
// schema's minimums keep maxAge at 10m or more) or that need a fault: the timers, reports
// and ban-driven replacement, quota, a permanent failure, a run started from continued
// state. No Proxy object exists, so status writes find nothing to write; everything else is
// what production runs. With RECORD_HISTORIES=1 each records its history for the replay
// corpus.

// driven is one ProxyWorkflow started by a test.
type driven struct {
	t    *testing.T
	s    *stack.Stack
	id   string
	uid  string
	gen  int64
	spec v1alpha1.ProxySpec
}

func drive(t *testing.T, s *stack.Stack, name string, spec v1alpha1.ProxySpec, tuning workflows.Tuning) *driven {
	t.Helper()
	ns := "drv-" + fmt.Sprint(time.Now().UnixNano()%1_000_000)
	d := &driven{t: t, s: s, id: contract.ProxyWorkflowID(ns, name), uid: ns + "-" + name + "-uid", gen: 1, spec: spec}
	_, err := s.Temporal.Client.SignalWithStartWorkflow(context.Background(), d.id, contract.SignalSpec,
		workflows.SpecSignal{UID: d.uid, Generation: d.gen, Spec: spec},
		tclient.StartWorkflowOptions{ID: d.id, TaskQueue: s.TaskQueue, TypedSearchAttributes: contract.InitialSearchAttributes(spec.ProviderLabel())},
		contract.ProxyWorkflowType, workflows.ProxyWorkflowInput{Namespace: ns, Name: name, Installation: s.Installation, Tuning: tuning})
	require.NoError(t, err)
	return d
}

func (d *driven) waitState(what string, ok func(workflows.ProxyState) bool) workflows.ProxyState {
	d.t.Helper()
	var last workflows.ProxyState
	deadline := time.Now().Add(2 * time.Minute)
	for {
		v, err := d.s.Temporal.Client.QueryWorkflow(context.Background(), d.id, "", contract.QueryState)
		var st workflows.ProxyState // fresh each time: decoding into a used one would merge maps
		if err == nil && v.Get(&st) == nil {
			if ok(st) {
				return st
			}
			last = st
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: %s not reached; last state: phase %s, quota %q, lastError %q, failure %+v, attempt %d",
				d.id, what, last.Phase, last.Quota, last.LastError, last.Failure, last.Attempt)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *driven) signal(name string, arg any) {
	d.t.Helper()
	require.NoError(d.t, d.s.Temporal.Client.SignalWorkflow(context.Background(), d.id, "", name, arg))
}

// respec sends the next generation of the spec after mut.
func (d *driven) respec(mut func(*v1alpha1.ProxySpec)) {
	d.gen++
	mut(&d.spec)
	d.signal(contract.SignalSpec, workflows.SpecSignal{UID: d.uid, Generation: d.gen, Spec: d.spec})
}

// finish deletes the proxy, waits for the workflow to complete and records its history.
func (d *driven) finish(file string) {
	d.t.Helper()
	d.signal(contract.SignalDelete, contract.DeleteSignal{UID: d.uid})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(d.t, d.s.Temporal.Client.GetWorkflow(ctx, d.id, "").Get(ctx, nil))
	e2e.RecordHistory(d.t, d.s, d.id, file)
}

func ready(st workflows.ProxyState) bool { return st.Phase == v1alpha1.PhaseReady }

// TestTimersReportsAndBans: reports set cooldowns, bans on enough targets replace the
// instance, a lasting unhealthy verdict replaces it after its grace, and maxAge replaces it
// on a timer.
func TestTimersReportsAndBans(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	spec := s.LocalProxy("x", "x").Spec
	two := int32(2)
	window := v1alpha1.Duration("1m")
	spec.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: &two, BanWindow: &window}
	d := drive(t, s, "timers", spec, s.Tuning)
	d.waitState("Ready", ready)

	d.signal(contract.SignalReport, contract.ReportSignal{Target: "a.example", Result: contract.ReportRateLimited})
	d.signal(contract.SignalReport, contract.ReportSignal{Target: "b.example", Result: contract.ReportBanned})
	d.waitState("a cooldown", func(st workflows.ProxyState) bool { return len(st.Cooldowns) == 2 })
	d.signal(contract.SignalReport, contract.ReportSignal{Target: "c.example", Result: contract.ReportBanned})
	st := d.waitState("replaced for bans", func(st workflows.ProxyState) bool { return st.Replacements == 1 && ready(st) })
	assert.Empty(t, st.Cooldowns, "a new address starts clean")

	grace := v1alpha1.Duration("2s")
	d.respec(func(p *v1alpha1.ProxySpec) { p.Lifecycle.UnhealthyReplaceAfter = &grace })
	d.waitState("the new generation", func(st workflows.ProxyState) bool { return st.Generation == d.gen })
	_, _, err := s.Daemon.SetFault(st.Instance.Name, local.FaultBadGateway)
	require.NoError(t, err)
	d.waitState("replaced after the unhealthy grace", func(st workflows.ProxyState) bool { return st.Replacements == 2 && ready(st) })

	maxAge := v1alpha1.Duration("3s")
	d.respec(func(p *v1alpha1.ProxySpec) { p.Lifecycle = &v1alpha1.Lifecycle{MaxAge: &maxAge} })
	d.waitState("replaced at maxAge", func(st workflows.ProxyState) bool { return st.Replacements >= 3 && ready(st) })
	d.finish("timers-reports-bans.json")
}

// TestQuotaThenPermanentFailure: a namespace's ResourceQuota refuses the pod (a quota wait,
// retried), the quota is lifted and the pod is created; then a spec the API server rejects
// latches Failed until a newer generation; the deletion still deletes.
func TestQuotaThenPermanentFailure(t *testing.T) {
	// The driver's workflow is not in the pods' namespace; the worker is told to allow it.
	s := stack.Start(t, stack.Options{KubernetesAllow: kubernetes.Allow{Namespaces: []string{"*"}}})
	ctx := context.Background()
	ns := s.Namespace(t)
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-pods"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}
	require.NoError(t, s.Kube.Client.Create(ctx, quota))
	// No quota controller runs here: set the usage it would compute, so admission enforces it.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	require.NoError(t, s.Kube.Client.Status().Update(ctx, quota))

	spec := s.LocalProxy("x", "x").Spec
	spec.Provider, spec.Local = v1alpha1.ProviderKubernetes, nil
	spec.Kubernetes = &v1alpha1.KubernetesSpec{Namespace: ns}
	d := drive(t, s, "quota", spec, s.Tuning)
	d.waitState("a quota wait", func(st workflows.ProxyState) bool { return st.Quota != "" && st.Attempt >= 2 })

	require.NoError(t, s.Kube.Client.Delete(ctx, quota))
	d.waitState("the pod created", func(st workflows.ProxyState) bool {
		return st.Quota == "" && st.Instance != nil && st.Instance.Created
	})

	// Requests above limits: the API server refuses the pod as invalid.
	d.respec(func(p *v1alpha1.ProxySpec) {
		p.Kubernetes.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
		}
	})
	st := d.waitState("Failed", func(st workflows.ProxyState) bool { return st.Failure != nil && st.Failure.Generation == d.gen })
	assert.Contains(t, st.Failure.Message, "limit")
	d.finish("quota-then-permanent.json")
}

// TestContinuedRun: a run that reaches its maximum age continues as new; the next run
// carries on from its state, without a new instance, and deletes it at the end.
func TestContinuedRun(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	tuning := s.Tuning
	tuning.MaxRunAge = 3 * time.Second
	d := drive(t, s, "continued", s.LocalProxy("x", "x").Spec, tuning)
	first := d.waitState("Ready", ready)
	ctx := context.Background()
	desc, err := s.Temporal.Client.DescribeWorkflow(ctx, d.id, "")
	require.NoError(t, err)
	runID := desc.WorkflowExecution.RunID
	require.Eventually(t, func() bool {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, d.id, "")
		return err == nil && desc.WorkflowExecution.RunID != runID
	}, time.Minute, 100*time.Millisecond, "the run never continued as new")
	st := d.waitState("Ready in the next run", ready)
	assert.Equal(t, first.Instance.Name, st.Instance.Name, "the same instance")
	assert.False(t, st.Unlisted, "a continued run knows its instances")
	d.finish("continued.json")
	e2e.RecordRun(t, s, d.id, runID, "continued-first-run.json")
}
