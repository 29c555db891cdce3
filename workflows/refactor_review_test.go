package workflows

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Review tests for the refactor that split proxy.go (commits after a826caa): the pieces
// that were restructured rather than moved — the one selector every wait uses (waiter.next),
// the status built from one function per condition, and what to publish decided by
// view.publication — are checked against the code they replaced, kept here verbatim (but
// for names) as the reference. Open runs of versions 0..5 replay only if these agree.

// allVersions are the versions a run may have started with.
var allVersions = []workflow.Version{workflow.DefaultVersion, versionLongLived, versionCredentials,
	versionLostFirst, versionShardMonitor, versionServeWhileReplacing}

// --- the selector -----------------------------------------------------------------------

// TestReviewNextSelectsInTheOrderEveryWaitAddedItsCases: when everything a wait selects on
// is ready at once, next takes it in the order the waits added their cases before they
// shared one selector — await: its activity, then the signals; steady: the signals, the
// Monitor activity, version 4's shard reports, the wake, the status rewrite; waitSignals:
// the signals, the backoff, the status rewrite; await's throttled publish last. Signals in
// addSignals' order: spec, delete, report, replace, and (version 5) monitor reports.
func TestReviewNextSelectsInTheOrderEveryWaitAddedItsCases(t *testing.T) {
	signals := []string{"spec", "delete", "report", "replace"}
	cases := []struct {
		version workflow.Version
		want    []string
	}{
		{workflow.DefaultVersion, append(append([]string{"activity"}, signals...), "monitor", "deadline", "republish", "publish")},
		{versionLostFirst, append(append([]string{"activity"}, signals...), "monitor", "deadline", "republish", "publish")},
		{versionShardMonitor, append(append([]string{"activity"}, signals...), "monitor", "shard report", "deadline", "republish", "publish")},
		{versionServeWhileReplacing, append(append([]string{"activity"}, signals...), "monitor signal", "monitor", "deadline", "republish", "publish")},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("version %d", tc.version), func(t *testing.T) {
			p := policyFor(tc.version)
			wf := func(ctx workflow.Context) ([]string, error) {
				mk := func(v any) workflow.Channel {
					c := workflow.NewBufferedChannel(ctx, 1)
					c.SendAsync(v)
					return c
				}
				spec, del := mk(SpecSignal{}), mk(contract.DeleteSignal{})
				rep, repl := mk(contract.ReportSignal{}), mk(contract.ReplaceSignal{})
				mon := mk(activities.MonitorReport{}) // no epoch: stale, dropped
				st := steadyState()
				w := &proxyWorkflow{log: workflow.GetLogger(ctx), now: func() time.Time { return workflow.Now(ctx) },
					state: &st, policy: p, tuning: tuning0,
					ch: signalChannels{spec: spec, del: del, repl: repl, report: rep, monitor: mon}}
				ready := func() workflow.Future {
					f, set := workflow.NewFuture(ctx)
					set.Set(nil, nil)
					return f
				}
				wt := waiter{activity: ready(), monitor: ready(), reports: p.shardWatched && !p.serveWhileReplacing,
					deadline: ready(), republish: ready(), publish: ready()}
				var got []string
				for range tc.want {
					before := map[string]int{"spec": spec.Len(), "delete": del.Len(), "report": rep.Len(), "replace": repl.Len(), "mon": mon.Len()}
					ev := w.next(ctx, &wt)
					after := map[string]int{"spec": spec.Len(), "delete": del.Len(), "report": rep.Len(), "replace": repl.Len(), "mon": mon.Len()}
					took := ""
					for _, k := range []string{"spec", "delete", "report", "replace", "mon"} {
						if after[k] < before[k] {
							took = k
						}
					}
					switch {
					case ev.activity:
						got, wt.activity = append(got, "activity"), nil
					case ev.monitor:
						got, wt.monitor = append(got, "monitor"), nil
					case ev.deadline:
						got, wt.deadline = append(got, "deadline"), nil
					case ev.republish:
						got, wt.republish = append(got, "republish"), nil
					case ev.publish:
						got, wt.publish = append(got, "publish"), nil
					case took == "mon" && wt.reports:
						got = append(got, "shard report")
					case took == "mon":
						got = append(got, "monitor signal")
					default:
						got = append(got, took)
					}
				}
				return got, nil
			}
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			env.RegisterWorkflowWithOptions(wf, workflow.RegisterOptions{Name: "review-next"})
			env.ExecuteWorkflow("review-next")
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got []string
			require.NoError(t, env.GetWorkflowResult(&got))
			assert.Equal(t, tc.want, got)
		})
	}
}

// --- the status -------------------------------------------------------------------------

// statusBeforeSplit is status() as it was before its conditions became one function each
// (a826caa:workflows/plan.go).
func statusBeforeSplit(s *ProxyState, workflowID string) v1alpha1.ProxyStatus {
	ph := phase(s)
	st := v1alpha1.ProxyStatus{
		Phase:              ph,
		Replacements:       s.Replacements,
		ObservedGeneration: s.Generation,
		WorkflowID:         workflowID,
	}
	external := s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeExternal
	provisioned := metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonPending, "waiting for the first spec")
	switch {
	case external:
		st.IP = s.Spec.Endpoint.Host
		st.Port = s.Spec.Endpoint.Port
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "True", v1alpha1.ReasonExternalEndpoint,
			fmt.Sprintf("external endpoint %s:%d", s.Spec.Endpoint.Host, s.Spec.Endpoint.Port))
	case s.Instance.Running():
		st.IP, st.Port = s.Instance.IP, s.Instance.Port
		st.InstanceName, st.ProviderID = s.Instance.Name, s.Instance.ProviderID
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "True", v1alpha1.ReasonInstanceRunning,
			fmt.Sprintf("instance %s is running", s.Instance.Name))
	case s.Failure != nil && s.Failure.Generation == s.Generation:
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonPermanentError, s.Failure.Message)
	case s.CloudInitError != "":
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonCloudInitError, s.CloudInitError)
	case s.Quota != "":
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonQuotaExceeded, s.Quota)
	case s.LastError != "":
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonProviderError, s.LastError)
	case s.Instance != nil:
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonProvisioning,
			fmt.Sprintf("waiting for instance %s to be running", s.Instance.Name))
	}
	if s.Deleting {
		provisioned = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonDeleting, "deleting the instance")
	} else if ph == v1alpha1.PhaseReplacing && s.Instance.Running() {
		provisioned.Reason = v1alpha1.ReasonReplacing
		provisioned.Message = "instance " + s.Instance.Name + " serves while its replacement is built"
		if s.Next != nil {
			provisioned.Message += " (" + s.Next.Name + ")"
		}
	}

	healthy := metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonNotProbed, "no verdict yet")
	targetDown := s.Health.FailureReason == v1alpha1.ReasonHealthCheckTargetDown
	if s.Health.Known {
		st.LatencyMillis = s.Health.LatencyMillis
		if !s.Health.CheckedAt.IsZero() {
			st.LastHealthCheckTime = &metav1.Time{Time: s.Health.CheckedAt}
		}
		switch {
		case s.Health.Healthy && targetDown:
			healthy = metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, s.Health.LastFailure)
		case s.Health.Healthy:
			healthy = metav1Condition(v1alpha1.ConditionHealthy, "True", v1alpha1.ReasonProbeSucceeded,
				fmt.Sprintf("probes through the proxy succeed (%dms)", s.Health.LatencyMillis))
		default:
			msg := s.Health.LastFailure
			if k := s.Health.FailureKind; k != "" {
				msg = string(k) + ": " + msg
			}
			reason := v1alpha1.ReasonProbeFailed
			if r := s.Health.FailureReason; r != "" {
				reason = r
			}
			if msg == "instance "+LostPreempted {
				reason, msg = v1alpha1.ReasonPreempted, "the provider took the instance back (preempted); a new one is being created"
			}
			healthy = metav1Condition(v1alpha1.ConditionHealthy, "False", reason, msg)
		}
	} else if targetDown {
		healthy = metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, s.Health.LastFailure)
	}

	quota := metav1Condition(v1alpha1.ConditionQuotaExceeded, "False", v1alpha1.ReasonQuotaAvailable, "")
	if s.Quota != "" {
		quota = metav1Condition(v1alpha1.ConditionQuotaExceeded, "True", v1alpha1.ReasonQuotaExceeded, s.Quota)
	}

	ready := metav1Condition(v1alpha1.ConditionReady, "False", v1alpha1.ReasonNotReady, "phase "+string(ph))
	heldHealthy := targetDown && s.Health.Known && s.Health.Healthy
	if provisioned.Status == "True" && (healthy.Status == "True" || heldHealthy) && !s.Deleting {
		ready = metav1Condition(v1alpha1.ConditionReady, "True", v1alpha1.ReasonReady, "provisioned and healthy")
		if heldHealthy {
			ready.Message = "provisioned, and healthy when its health-check target last answered"
		}
	}
	st.Conditions = append(st.Conditions, provisioned, healthy, quota, ready)
	return st
}

// reviewStates is a grid of states over everything status, phase and the memo read.
func reviewStates() []ProxyState {
	managed := managedSpec(func(s *v1alpha1.ProxySpec) {
		s.MaxLeases = 3
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu", "tier": "a"}
	})
	external := externalSpec()
	externalCreds := externalSpec()
	externalCreds.Endpoint.CredentialsSecretRef = &v1alpha1.SecretRef{Name: "creds"}
	specs := []*v1alpha1.ProxySpec{nil, managed, external, externalCreds}

	running := runningRef("a", managed)
	running.ProviderID = "fake/a"
	keyed := runningRef("a", managed)
	keyed.KeyID = "k1"
	outdated := runningRef("a", managed)
	outdated.Hash = "old"
	outdated.KeyID = "k1"
	provisioning := &InstanceRef{Name: "a", Created: true, State: provider.StateProvisioning}
	instances := []*InstanceRef{nil, provisioning, running, keyed, outdated}

	healths := []activities.Health{
		{},
		{FailureReason: v1alpha1.ReasonHealthCheckTargetDown, LastFailure: "target down"},
		{Known: true, Healthy: true, LatencyMillis: 12, CheckedAt: t0, Since: t0.Add(-time.Hour)},
		{Known: true, Healthy: true, LatencyMillis: 12, FailureReason: v1alpha1.ReasonHealthCheckTargetDown, LastFailure: "target down"},
		{Known: true, LastFailure: "refused", FailureKind: probe.KindProxyAuth},
		{Known: true, LastFailure: "no label", FailureReason: v1alpha1.ReasonCredentialsNotLabelled},
		{Known: true, LastFailure: "instance " + LostPreempted},
	}
	type errs struct{ quota, cloudInit, last string }
	errors := []errs{{}, {quota: "no CPUs"}, {cloudInit: "bad secret"}, {last: "boom"}, {quota: "no CPUs", last: "boom"},
		{quota: "no CPUs", cloudInit: "bad secret", last: "boom"}}

	var out []ProxyState
	for _, spec := range specs {
		for _, deleting := range []bool{false, true} {
			for fi, failure := range []*Failure{nil, {Generation: 2, Message: "permanent"}, {Generation: 1, Message: "old"}} {
				for _, inst := range instances {
					for _, next := range []*InstanceRef{nil, {Name: "b", Created: true}} {
						for _, h := range healths {
							for ei, e := range errors {
								for _, auth := range []bool{false, true} {
									s := ProxyState{UID: "u1", Generation: 2, Spec: spec, Deleting: deleting, Failure: failure,
										Instance: inst, Next: next, Health: h, Quota: e.quota, CloudInitError: e.cloudInit,
										LastError: e.last, Counter: (fi + ei) % 2, Replacements: 3, Sealed: map[bool]string{true: "sealed"}[auth],
										Cooldowns: map[string]time.Time{"gone.example": t0.Add(-time.Minute), "on.example": t0.Add(time.Minute)}}
									s.policy.requireAuth = auth
									out = append(out, s)
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

// TestReviewStatusIsTheStatusBeforeTheSplit: every state of the grid gets the status it
// got before status() was split into one function per condition.
func TestReviewStatusIsTheStatusBeforeTheSplit(t *testing.T) {
	states := reviewStates()
	require.Greater(t, len(states), 10000)
	for i := range states {
		s := states[i]
		want := statusBeforeSplit(&s, "wf")
		got := status(&s, "wf")
		if !assert.True(t, equalData(want, got), "state %d: %+v\nwant %+v\n got %+v", i, s, want, got) {
			return
		}
	}
}

// --- what is published ------------------------------------------------------------------

// formerWritten is what proxyWorkflow remembered of its last write before the written
// struct: its fields under their old names.
type formerWritten struct {
	memo       *contract.ProxyMemo
	saPhase    v1alpha1.Phase
	saHealthy  *bool
	watchEpoch string
	watchSet   bool
	verdictPub *activities.Verdict
	memoDirty  bool
}

// formerRun carries the helpers of a826caa:workflows/proxy.go that publishState used,
// with w.version where they compared it.
type formerRun struct {
	state   *ProxyState
	in      ProxyWorkflowInput
	tuning  Tuning
	version workflow.Version
	now     time.Time
}

func (w formerRun) instanceInput(ref *InstanceRef) activities.InstanceInput {
	return activities.InstanceInput{
		Provider: ref.Provider, Name: ref.Name, ProxyUID: w.state.UID, Namespace: w.in.Namespace,
		Spec: ref.Spec, ProviderID: ref.ProviderID, SpecHash: ref.Hash,
		PollInterval: w.tuning.PollInterval, MaxWait: w.tuning.WaitRunningMax,
	}
}

func (w formerRun) monitorInput() (activities.MonitorInput, bool) {
	s := w.state
	if s.Spec == nil || s.Deleting {
		return activities.MonitorInput{}, false
	}
	in := activities.MonitorInput{HealthCheck: s.Spec.HealthCheck, Last: s.Health, DriftInterval: w.tuning.DriftInterval}
	switch {
	case s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		in.Target = net.JoinHostPort(s.Spec.Endpoint.Host, strconv.Itoa(int(s.Spec.Endpoint.Port)))
		if ref := s.Spec.Endpoint.CredentialsSecretRef; ref != nil {
			in.Auth = &activities.ProbeAuth{Namespace: w.in.Namespace, Secret: ref.Name, UID: s.UID, Sealed: s.Sealed}
		}
	case s.Instance.Running():
		in.Target = net.JoinHostPort(s.Instance.IP, strconv.Itoa(int(s.Instance.Port)))
		ii := w.instanceInput(s.Instance)
		in.Instance = &ii
		in.Auth = managedAuth(s.Instance)
	default:
		return in, false
	}
	return in, true
}

func (w formerRun) watch() *activities.MonitorMemo {
	in, ok := w.monitorInput()
	if !ok {
		return nil
	}
	if in.Instance != nil {
		ii := *in.Instance
		spec := ii.Spec
		ii.Spec = v1alpha1.ProxySpec{Mode: spec.Mode, Provider: spec.Provider, Port: spec.Port,
			GCP: spec.GCP, Kubernetes: spec.Kubernetes, Local: spec.Local}
		ii.PollInterval, ii.MaxWait, ii.SpecHash = 0, 0, ""
		in.Instance = &ii
	}
	return &activities.MonitorMemo{Epoch: watchEpoch(in), Input: in}
}

func (w formerRun) verdictOf(watch *activities.MonitorMemo) *activities.Verdict {
	h := w.state.Health
	if watch == nil || !h.Known {
		return nil
	}
	v := &activities.Verdict{Epoch: watch.Epoch, Healthy: h.Healthy, Since: h.Since, LatencyMillis: h.LatencyMillis}
	if w.version >= versionServeWhileReplacing {
		v.FailureReason = h.FailureReason
	}
	return v
}

func (w formerRun) sameWatch(last *formerWritten, watch *activities.MonitorMemo) bool {
	if w.version < versionShardMonitor {
		return true
	}
	epoch := ""
	if watch != nil {
		epoch = watch.Epoch
	}
	return last.watchSet && epoch == last.watchEpoch
}

func (w formerRun) providerName() string {
	if w.state.Spec == nil {
		return ""
	}
	return w.state.Spec.ProviderLabel()
}

func (w formerRun) leasable(st v1alpha1.ProxyStatus) bool {
	s := w.state
	if st.Phase == v1alpha1.PhaseReady {
		return true
	}
	return w.version >= versionServeWhileReplacing && st.Phase == v1alpha1.PhaseReplacing &&
		s.Instance.Running() && s.Health.Known && s.Health.Healthy
}

func (w formerRun) memoOf(st v1alpha1.ProxyStatus) contract.ProxyMemo {
	s := w.state
	m := contract.ProxyMemo{
		Name: w.in.Name, Namespace: w.in.Namespace, UID: s.UID, Phase: string(st.Phase),
		Healthy: w.leasable(st), IP: st.IP, Port: st.Port,
		LatencyMillis: st.LatencyMillis, Provider: w.providerName(),
	}
	if s.Spec != nil {
		m.MaxLeases = s.Spec.MaxLeases
		for _, k := range sortedKeys(s.Spec.Attributes) {
			if m.Attributes == nil {
				m.Attributes = make(map[string]string, len(s.Spec.Attributes))
			}
			m.Attributes[k] = string(s.Spec.Attributes[k])
		}
	}
	switch {
	case s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		if s.Spec.Endpoint != nil && s.Spec.Endpoint.CredentialsSecretRef != nil {
			if s.Sealed != "" {
				m.Auth = &contract.ProxyAuth{Sealed: s.Sealed}
			} else {
				m.Healthy = false
			}
		}
	case s.Instance != nil && s.Instance.KeyID != "":
		m.Auth = &contract.ProxyAuth{KeyID: s.Instance.KeyID, Instance: s.Instance.Name}
	}
	for _, target := range sortedKeys(s.Cooldowns) {
		if until := s.Cooldowns[target]; until.After(w.now) {
			if m.Cooldowns == nil {
				m.Cooldowns = map[string]time.Time{}
			}
			m.Cooldowns[target] = until
		}
	}
	return m
}

// publish is the memo and search-attribute half of the former publishState: what it
// wrote (nil: nothing), the search attributes, and what it remembered afterwards.
func (w formerRun) publish(st v1alpha1.ProxyStatus, last *formerWritten) (fields map[string]any, phase v1alpha1.Phase, providerName string, healthy bool) {
	healthy = w.leasable(st)
	memo := w.memoOf(st)
	fields = map[string]any{contract.MemoKey: memo}
	var watch *activities.MonitorMemo
	var verdict *activities.Verdict
	sameVerdict := true
	if w.version >= versionShardMonitor {
		watch = w.watch()
		switch {
		case w.sameWatch(last, watch):
		case watch != nil:
			fields[activities.MonitorMemoKey] = watch
		default:
			fields[activities.MonitorMemoKey] = nil
		}
		verdict = w.verdictOf(watch)
		sameVerdict = equalData(verdict, last.verdictPub)
		switch {
		case sameVerdict:
		case verdict != nil:
			fields[activities.VerdictMemoKey] = verdict
		default:
			fields[activities.VerdictMemoKey] = nil
		}
	}
	unchanged := last.memo != nil && equalData(*last.memo, memo) && !last.memoDirty && w.sameWatch(last, watch) && sameVerdict
	if unchanged && last.saPhase == st.Phase && last.saHealthy != nil && *last.saHealthy == healthy {
		return nil, "", "", false
	}
	last.memo, last.saPhase, last.saHealthy, last.memoDirty = &memo, st.Phase, &healthy, false
	if w.version >= versionShardMonitor {
		last.verdictPub = verdict
		last.watchSet, last.watchEpoch = true, ""
		if watch != nil {
			last.watchEpoch = watch.Epoch
		}
	}
	return fields, st.Phase, w.providerName(), healthy
}

// TestReviewPublicationIsWhatPublishStateWrote: for every version, along a walk through
// the grid of states (each step publishing from what the step before left, sometimes with
// a report's dirty memo), publication writes exactly when the former publishState wrote,
// the same memo fields and search attributes, and remembers the same; what it does not
// own (the status write's bookkeeping, the time of the last write) it carries over as is.
func TestReviewPublicationIsWhatPublishStateWrote(t *testing.T) {
	states := reviewStates()
	in := ProxyWorkflowInput{Name: "px", Namespace: "ns"}
	for _, v := range allVersions {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			p := policyFor(v)
			former := &formerWritten{}
			st0 := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady}
			last := written{status: &st0, retryAt: t0.Add(time.Minute), failures: 2, at: t0.Add(-time.Hour)}
			writes := 0
			// A walk that revisits states, so both "unchanged" and "changed" are met.
			for i := 0; i < len(states); i += 7 {
				for _, j := range []int{i, i, (i * 31) % len(states), i} {
					s := states[j]
					s.policy.legacy, s.policy.createFirst, s.policy.shardWatched, s.policy.serveWhileReplacing =
						p.legacy, p.createFirst, p.shardWatched, p.serveWhileReplacing
					s.policy.requireAuth = p.requireAuth && states[j].policy.requireAuth
					dirty := (i+j)%5 == 0
					former.memoDirty = dirty
					st := status(&s, "wf")
					fw := formerRun{state: &s, in: in, tuning: tuning0, version: v, now: t0}
					wantFields, wantPhase, wantProvider, wantHealthy := fw.publish(st, former)
					view := view{state: &s, in: in, policy: policyFor(v), tuning: tuning0}
					before := last
					pub, write := view.publication(st, last, dirty, t0)
					if !assert.Equal(t, wantFields != nil, write, "state %d: write", j) {
						return
					}
					assert.Equal(t, before, last, "publication changed what it was given")
					if !write {
						continue
					}
					writes++
					if !assert.True(t, equalData(wantFields, pub.fields), "state %d: fields\nwant %#v\n got %#v", j, wantFields, pub.fields) {
						return
					}
					assert.Equal(t, wantPhase, pub.phase)
					assert.Equal(t, wantProvider, pub.provider)
					assert.Equal(t, wantHealthy, pub.healthy)
					next := pub.next
					assert.True(t, equalData(*former.memo, *next.memo))
					assert.Equal(t, former.saPhase, next.phase)
					assert.Equal(t, *former.saHealthy, *next.healthy)
					assert.Equal(t, former.watchSet, next.watchSet)
					assert.Equal(t, former.watchEpoch, next.watchEpoch)
					assert.True(t, equalData(former.verdictPub, next.verdict))
					// Not publication's to change: publishState sets at after the write.
					assert.Same(t, last.status, next.status)
					assert.Equal(t, last.retryAt, next.retryAt)
					assert.Equal(t, last.failures, next.failures)
					assert.Equal(t, last.at, next.at)
					if last.memo != nil {
						assert.NotSame(t, last.memo, next.memo, "a new memo, not the last one changed")
					}
					last = next
				}
			}
			assert.Greater(t, writes, 100, "the walk wrote too seldom to say anything")
		})
	}
}
