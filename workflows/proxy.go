package workflows

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

var a *activities.Activities

// ProxyWorkflow owns one Proxy for its whole life: it creates the instance, publishes its
// address and health, replaces it make-before-break, and deletes it when the Proxy goes.
// Its decisions come from plan(); this function carries them out and listens for signals.
func ProxyWorkflow(ctx workflow.Context, in ProxyWorkflowInput) error {
	w := &proxyWorkflow{
		in:     in,
		tuning: in.Tuning.WithDefaults(),
		log:    workflow.GetLogger(ctx),
		specCh: workflow.GetSignalChannel(ctx, contract.SignalSpec),
		delCh:  workflow.GetSignalChannel(ctx, contract.SignalDelete),
		replCh: workflow.GetSignalChannel(ctx, contract.SignalReplace),
		repCh:  workflow.GetSignalChannel(ctx, contract.SignalReport),
		now:    func() time.Time { return workflow.Now(ctx) },
		state:  in.State,
		wfID:   workflow.GetInfo(ctx).WorkflowExecution.ID,
	}
	if w.state == nil {
		w.state = &ProxyState{}
	}
	if err := workflow.SetQueryHandler(ctx, contract.QueryState, func() (*ProxyState, error) { return w.state, nil }); err != nil {
		return err
	}
	return w.run(ctx)
}

type proxyWorkflow struct {
	in     ProxyWorkflowInput
	tuning Tuning
	log    log.Logger
	state  *ProxyState
	wfID   string

	specCh, delCh, replCh, repCh workflow.ReceiveChannel
	now                          func() time.Time
	// memoDirty is set by a report: cooldowns changed and discovery must see them.
	memoDirty bool

	// interrupt is set by a signal that changes what plan() would choose.
	interrupt bool
	// published and memo remember what was last written, so nothing is written twice.
	published *v1alpha1.ProxyStatus
	memo      *contract.ProxyMemo
	saPhase   v1alpha1.Phase
	saHealthy *bool
}

func (w *proxyWorkflow) run(ctx workflow.Context) error {
	s := w.state
	for {
		w.drainSignals()
		if err := w.publishState(ctx); err != nil {
			return err
		}
		if w.shouldContinueAsNew(ctx) {
			return w.continueAsNew(ctx)
		}
		w.interrupt = false
		now := workflow.Now(ctx)
		st := plan(s, now)
		var err error
		switch st {
		case stepIdle:
			w.details(ctx, w.idleReason())
			w.waitSignals(ctx, time.Time{})
		case stepFinish:
			return w.finish(ctx)
		case stepDelete:
			err = w.deleteRetiring(ctx)
		case stepHash:
			err = w.hash(ctx)
		case stepCreate:
			if s.Instance == nil {
				s.Instance = w.newInstance(ctx)
			}
			err = w.create(ctx, s.Instance.Name)
		case stepRetireCurrent:
			s.Retiring = append(s.Retiring, *s.Instance)
			s.Instance = nil
		case stepWaitRunning:
			err = w.waitRunning(ctx, s.Instance.Name)
		case stepCreateNext:
			if s.Next == nil {
				s.Next = w.newInstance(ctx)
			}
			err = w.create(ctx, s.Next.Name)
		case stepRetireNext:
			s.Retiring = append(s.Retiring, *s.Next)
			s.Next = nil
		case stepWaitNext:
			err = w.waitRunning(ctx, s.Next.Name)
		case stepVerifyNext:
			err = w.verifyNext(ctx)
		case stepPromote:
			w.promote(ctx)
		case stepSteady:
			err = w.steady(ctx)
		}
		if err != nil {
			return err
		}
	}
}

// newInstance allocates the next instance record. It is recorded before Create runs, so an
// instance whose creation is cut short is still known and later deleted.
func (w *proxyWorkflow) newInstance(ctx workflow.Context) *InstanceRef {
	s := w.state
	s.Counter++
	return &InstanceRef{
		Provider:  s.Spec.Provider,
		Name:      InstanceName(s.UID, s.Counter),
		Hash:      DesiredHash(s.Spec, s.SecretHash),
		Spec:      *s.Spec,
		CreatedAt: workflow.Now(ctx),
	}
}

// find returns the instance record with this name wherever it is kept.
func (w *proxyWorkflow) find(name string) *InstanceRef {
	s := w.state
	if s.Instance != nil && s.Instance.Name == name {
		return s.Instance
	}
	if s.Next != nil && s.Next.Name == name {
		return s.Next
	}
	for i := range s.Retiring {
		if s.Retiring[i].Name == name {
			return &s.Retiring[i]
		}
	}
	return nil
}

func (w *proxyWorkflow) instanceInput(ref *InstanceRef) activities.InstanceInput {
	return activities.InstanceInput{
		Provider: ref.Provider, Name: ref.Name, ProxyUID: w.state.UID, Namespace: w.in.Namespace,
		Spec: ref.Spec, ProviderID: ref.ProviderID,
		PollInterval: w.tuning.PollInterval, MaxWait: w.tuning.WaitRunningMax,
	}
}

// --- signals -------------------------------------------------------------------------

func (w *proxyWorkflow) addSignals(sel workflow.Selector) {
	sel.AddReceive(w.specCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig SpecSignal
		c.ReceiveAsync(&sig)
		w.onSpec(sig)
	})
	sel.AddReceive(w.delCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.DeleteSignal
		c.ReceiveAsync(&sig)
		w.onDelete(sig)
	})
	sel.AddReceive(w.repCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.ReportSignal
		c.ReceiveAsync(&sig)
		w.onReport(sig)
	})
	sel.AddReceive(w.replCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.ReplaceSignal
		c.ReceiveAsync(&sig)
		w.onReplace(sig)
	})
}

// drainSignals applies every signal already received, without blocking.
func (w *proxyWorkflow) drainSignals() {
	for {
		var spec SpecSignal
		var del contract.DeleteSignal
		var repl contract.ReplaceSignal
		var rep contract.ReportSignal
		switch {
		case w.specCh.ReceiveAsync(&spec):
			w.onSpec(spec)
		case w.delCh.ReceiveAsync(&del):
			w.onDelete(del)
		case w.replCh.ReceiveAsync(&repl):
			w.onReplace(repl)
		case w.repCh.ReceiveAsync(&rep):
			w.onReport(rep)
		default:
			return
		}
	}
}

func (w *proxyWorkflow) onSpec(sig SpecSignal) {
	s := w.state
	if s.Deleting {
		if sig.UID != s.UID {
			// A new object with the same name: it gets this workflow ID once we are done.
			w.log.Info("spec for a new object arrived during deletion; kept for after", "uid", sig.UID)
			s.Successor = &sig
		}
		return
	}
	if s.UID != "" && sig.UID != s.UID {
		// The object was replaced without a delete reaching us (its finalizer was removed by
		// hand). Its instances are not wanted by the new object: retire them.
		w.log.Warn("spec for a different object UID; retiring the old object's instances", "old", s.UID, "new", sig.UID)
		w.retireAll()
		*s = ProxyState{Retiring: s.Retiring}
	}
	if sig.Generation < s.Generation || sig.Generation == s.Generation && sig.SecretVersion == s.SecretVersion {
		return // stale or duplicate: retries and restarts of the controller are harmless
	}
	s.UID, s.Generation, s.SecretVersion = sig.UID, sig.Generation, sig.SecretVersion
	spec := sig.Spec
	s.Spec = &spec
	s.NeedHash = spec.CloudInit != nil
	if !s.NeedHash {
		s.SecretHash = ""
	}
	s.CloudInitError = ""
	// A newer spec deserves a fresh attempt now, not after the last failure's backoff.
	s.Failure, s.RetryAt, s.Attempt, s.LastError, s.Quota = nil, time.Time{}, 0, "", ""
	w.interrupt = true
}

func (w *proxyWorkflow) onDelete(sig contract.DeleteSignal) {
	s := w.state
	if s.UID != "" && sig.UID != "" && sig.UID != s.UID {
		return // a delete for an older object with this name
	}
	if !s.Deleting {
		s.Deleting = true
		w.retireAll()
		w.interrupt = true
	}
}

func (w *proxyWorkflow) onReplace(sig contract.ReplaceSignal) {
	s := w.state
	if s.Deleting || s.Spec == nil || s.Spec.EffectiveMode() == v1alpha1.ModeExternal {
		w.log.Info("replace signal ignored: nothing to replace", "reason", sig.Reason)
		return
	}
	if sig.Reason == "" {
		sig.Reason = "manual"
	}
	s.ReplaceReason = sig.Reason
	// An explicit request deserves an attempt now.
	s.RetryAt, s.Attempt = time.Time{}, 0
	w.interrupt = true
}

// onReport records a crawler's report: a cooldown for the target (durable here, so it
// survives discovery restarts and reaches every replica through the memo), and for bans the
// distinct targets banned within lifecycle.banWindow, which may call for a replacement.
func (w *proxyWorkflow) onReport(sig contract.ReportSignal) {
	s := w.state
	if s.Spec == nil || s.Deleting || (sig.Result != contract.ReportBanned && sig.Result != contract.ReportRateLimited) {
		return
	}
	now := w.now()
	until := sig.Until
	if !until.After(now) {
		until = now.Add(DefaultCooldown)
	}
	if s.Cooldowns == nil {
		s.Cooldowns = map[string]time.Time{}
	}
	if until.After(s.Cooldowns[sig.Target]) {
		s.Cooldowns[sig.Target] = until
	}
	if sig.Result == contract.ReportBanned {
		if s.Bans == nil {
			s.Bans = map[string]time.Time{}
		}
		s.Bans[sig.Target] = now
	}
	s.pruneReports(now, w.banWindow())
	w.memoDirty = true
	if n, limit := len(s.Bans), w.banLimit(); limit > 0 && n >= limit && s.ReplaceReason == "" &&
		s.Spec.EffectiveMode() == v1alpha1.ModeManaged {
		s.ReplaceReason = fmt.Sprintf("banned on %d targets within %s", n, w.banWindow())
		w.interrupt = true
	}
}

func (w *proxyWorkflow) banWindow() time.Duration {
	if l := w.state.Spec.Lifecycle; l != nil && l.BanWindow != nil {
		if d, err := l.BanWindow.ParseDuration(v1alpha1.DefaultBanWindow); err == nil {
			return d
		}
	}
	return v1alpha1.DefaultBanWindow
}

func (w *proxyWorkflow) banLimit() int {
	if l := w.state.Spec.Lifecycle; l != nil && l.BanReplaceTargets != nil {
		return int(*l.BanReplaceTargets)
	}
	return 0
}

func (w *proxyWorkflow) retireAll() {
	s := w.state
	for _, r := range []*InstanceRef{s.Next, s.Instance} {
		if r != nil {
			s.Retiring = append(s.Retiring, *r)
		}
	}
	s.Instance, s.Next = nil, nil
	s.DeleteRetryAt = time.Time{}
}

// --- waiting -------------------------------------------------------------------------

// waitSignals blocks until a signal changes the plan or until (if set) passes.
func (w *proxyWorkflow) waitSignals(ctx workflow.Context, until time.Time) {
	var timerDone bool
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	var timer workflow.Future
	if !until.IsZero() {
		timer = workflow.NewTimerWithOptions(tctx, until.Sub(workflow.Now(ctx)), workflow.TimerOptions{Summary: "back off before retrying"})
	}
	for !w.interrupt && !timerDone {
		sel := workflow.NewSelector(ctx)
		w.addSignals(sel)
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timerDone = true })
		}
		sel.Select(ctx)
	}
}

// await waits for an activity future. While it runs, signals are applied; if one changes
// the plan and the activity may be abandoned, its context is cancelled. It reports whether
// the activity was interrupted.
func (w *proxyWorkflow) await(ctx workflow.Context, fut workflow.Future, cancel workflow.CancelFunc, interruptible bool, result any) (bool, error) {
	for {
		done := false
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(fut, func(workflow.Future) { done = true })
		w.addSignals(sel)
		sel.Select(ctx)
		if done {
			return false, fut.Get(ctx, result)
		}
		if w.interrupt && interruptible {
			cancel()
			_ = fut.Get(ctx, nil)
			return true, nil
		}
	}
}

// --- steps ---------------------------------------------------------------------------

func (w *proxyWorkflow) hash(ctx workflow.Context) error {
	s := w.state
	ref := s.Spec.CloudInit.SecretRef
	w.details(ctx, fmt.Sprintf("reading cloud-init Secret %s/%s", w.in.Namespace, ref.Name))
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 5, NonRetryableErrorTypes: []string{activities.ErrTypeCloudInit}},
	})
	var h string
	err := workflow.ExecuteLocalActivity(lctx, a.HashCloudInit, activities.HashInput{Namespace: w.in.Namespace, Ref: ref}).Get(ctx, &h)
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	s.SecretHash, s.NeedHash, s.CloudInitError = h, false, ""
	return nil
}

func (w *proxyWorkflow) create(ctx workflow.Context, name string) error {
	ref := w.find(name)
	w.details(ctx, fmt.Sprintf("creating instance %s (%s)", name, ref.Provider))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		Summary:             fmt.Sprintf("create %s (%s)", name, ref.Provider),
		StartToCloseTimeout: w.tuning.ActivityTimeout,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second, MaximumAttempts: 5,
			NonRetryableErrorTypes: []string{activities.ErrTypeQuota, activities.ErrTypePermanent, activities.ErrTypeCloudInit},
		},
	})
	var res activities.CreateResult
	// Create is never abandoned: a cancelled call could still create the instance after a
	// delete decided it did not exist. Signals wait until it returns.
	_, err := w.await(ctx, workflow.ExecuteActivity(actx, a.CreateInstance, w.instanceInput(ref)), func() {}, false, &res)
	ref = w.find(name) // signals may have moved it to Retiring
	if err != nil {
		if isType(err, activities.ErrTypePermanent) && ref != nil {
			// Nothing was created; the record is retired anyway so a delete makes sure.
			w.state.Retiring = append(w.state.Retiring, *ref)
			w.dropLive(name)
		}
		w.failed(ctx, err)
		return nil
	}
	w.succeeded()
	if ref == nil {
		return nil
	}
	ref.Created = true
	ref.ProviderID = res.Instance.ProviderID
	ref.State, ref.IP, ref.Port = res.Instance.State, res.Instance.IP, portOr(res.Instance.Port, &ref.Spec)
	if ref.Spec.CloudInit != nil && res.SecretHash != "" && res.SecretHash != w.state.SecretHash && !w.state.Deleting {
		// The Secret changed between hashing and creating: the instance was built from the
		// newer data, which is now what we want.
		w.state.SecretHash = res.SecretHash
		ref.Hash = DesiredHash(&ref.Spec, res.SecretHash)
	}
	return nil
}

// dropLive removes the instance from the live slots after it was copied to Retiring.
func (w *proxyWorkflow) dropLive(name string) {
	s := w.state
	if s.Instance != nil && s.Instance.Name == name {
		s.Instance = nil
	}
	if s.Next != nil && s.Next.Name == name {
		s.Next = nil
	}
}

func (w *proxyWorkflow) waitRunning(ctx workflow.Context, name string) error {
	ref := w.find(name)
	since := ref.CreatedAt
	w.details(ctx, fmt.Sprintf("waiting for instance %s to be running (since %s)", name, since.UTC().Format(time.RFC3339)))
	actx, cancel := workflow.WithCancel(ctx)
	actx = workflow.WithActivityOptions(actx, workflow.ActivityOptions{
		Summary:             "wait for " + name + " to run",
		StartToCloseTimeout: w.tuning.WaitRunningMax + time.Minute,
		HeartbeatTimeout:    max(w.tuning.HeartbeatTimeout, 3*w.tuning.PollInterval),
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second, NonRetryableErrorTypes: []string{activities.ErrTypePermanent}},
	})
	var res activities.WaitResult
	interrupted, err := w.await(ctx, workflow.ExecuteActivity(actx, a.WaitRunning, w.instanceInput(ref)), cancel, true, &res)
	if interrupted {
		return nil
	}
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	ref = w.find(name)
	if ref == nil {
		return nil
	}
	switch {
	case res.Gone:
		// Deleted behind our back before it ever ran: create it again under a new name.
		w.log.Warn("instance disappeared while provisioning", "instance", name)
		w.state.Retiring = append(w.state.Retiring, *ref)
		w.dropLive(name)
	case res.Instance.State == provider.StateStopped:
		w.log.Warn("instance stopped while provisioning", "instance", name)
		w.state.Retiring = append(w.state.Retiring, *ref)
		w.dropLive(name)
	default:
		ref.State, ref.IP, ref.Port = res.Instance.State, res.Instance.IP, portOr(res.Instance.Port, &ref.Spec)
		if ref.ProviderID == "" {
			ref.ProviderID = res.Instance.ProviderID
		}
	}
	return nil
}

// verifyNext probes the replacement until it has a verdict. A healthy replacement is
// promoted; an unhealthy one is retired and tried again later, unless the current instance
// is no better, in which case swapping costs nothing.
func (w *proxyWorkflow) verifyNext(ctx workflow.Context) error {
	s := w.state
	next := s.Next
	w.details(ctx, fmt.Sprintf("checking replacement %s through itself before switching", next.Name))
	in := activities.MonitorInput{
		Target:      net.JoinHostPort(next.IP, strconv.Itoa(int(next.Port))),
		HealthCheck: s.Spec.HealthCheck,
	}
	actx, cancel := workflow.WithCancel(ctx)
	actx = workflow.WithActivityOptions(actx, workflow.ActivityOptions{
		Summary:             "check replacement " + next.Name + " through itself",
		StartToCloseTimeout: 30 * time.Minute,
		HeartbeatTimeout:    monitorHeartbeatTimeout(in),
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	var res activities.MonitorResult
	interrupted, err := w.await(ctx, workflow.ExecuteActivity(actx, a.Monitor, in), cancel, true, &res)
	if interrupted {
		return nil
	}
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	if next = w.find(next.Name); next == nil || next != s.Next {
		return nil
	}
	h := res.Health
	next.Health = &h
	if !h.Healthy && s.Health.Known && s.Health.Healthy {
		w.log.Warn("replacement failed its health check; keeping the current instance", "instance", next.Name, "failure", h.LastFailure)
		s.Retiring = append(s.Retiring, *next)
		s.Next = nil
		s.LastError = "replacement " + next.Name + " failed its health check: " + h.LastFailure
		s.Attempt++
		s.RetryAt = workflow.Now(ctx).Add(w.backoff(s.Attempt))
	}
	return nil
}

// portOr is the instance's port as its provider reports it, or the spec's when the
// provider does not know it (a VM's listening port is whatever its image configures).
func portOr(p int32, spec *v1alpha1.ProxySpec) int32 {
	if p != 0 {
		return p
	}
	return spec.EffectivePort()
}

func (w *proxyWorkflow) promote(ctx workflow.Context) {
	s := w.state
	old := *s.Instance
	s.Instance, s.Next = s.Next, nil
	// The replacement passed its own health check; that verdict is now the proxy's.
	if s.Instance.Health != nil {
		s.Health = *s.Instance.Health
		s.Health.Since = workflow.Now(ctx)
		s.Instance.Health = nil
	}
	s.Instance.CreatedAt = workflow.Now(ctx)
	s.Retiring = append(s.Retiring, old)
	s.Replacements++
	// Bans and cooldowns were earned by the old address.
	s.Cooldowns, s.Bans = nil, nil
	w.memoDirty = true
	w.log.Info("replacement promoted", "new", s.Instance.Name, "old", old.Name, "reason", w.replaceReason())
	s.ReplaceReason = ""
}

func (w *proxyWorkflow) replaceReason() string {
	if r := w.state.ReplaceReason; r != "" {
		return r
	}
	return "spec changed"
}

func (w *proxyWorkflow) deleteRetiring(ctx workflow.Context) error {
	s := w.state
	ref := s.Retiring[0]
	w.details(ctx, fmt.Sprintf("deleting instance %s (%s)", ref.Name, ref.Provider))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		Summary:             fmt.Sprintf("delete %s (%s)", ref.Name, ref.Provider),
		StartToCloseTimeout: 15 * time.Minute,
		HeartbeatTimeout:    max(w.tuning.HeartbeatTimeout, 3*w.tuning.PollInterval),
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second, MaximumAttempts: 5},
	})
	// Deletes are not abandoned either: they are what keeps instances from leaking.
	_, err := w.await(ctx, workflow.ExecuteActivity(actx, a.DeleteInstance, w.instanceInput(&ref)), func() {}, false, nil)
	if err != nil {
		s.DeleteRetryAt = workflow.Now(ctx).Add(w.backoff(s.Attempt + 1))
		s.LastError = errorMessage(err)
		w.log.Warn("delete failed; will retry", "instance", ref.Name, "error", err)
		return nil
	}
	for i := range s.Retiring {
		if s.Retiring[i].Name == ref.Name {
			s.Retiring = append(s.Retiring[:i], s.Retiring[i+1:]...)
			break
		}
	}
	s.DeleteRetryAt = time.Time{}
	return nil
}

func (w *proxyWorkflow) finish(ctx workflow.Context) error {
	s := w.state
	w.details(ctx, "instances deleted; releasing the Proxy's finalizer")
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second},
	})
	ref := activities.ObjectRef{Namespace: w.in.Namespace, Name: w.in.Name, UID: s.UID}
	if err := workflow.ExecuteLocalActivity(lctx, a.ReleaseFinalizer, ref).Get(ctx, nil); err != nil {
		return err
	}
	w.drainSignals()
	if s.Successor != nil {
		// A new object took this name while we were deleting: start over for it.
		next := w.in
		next.State = &ProxyState{}
		succ := *s.Successor
		w.state = next.State
		w.onSpec(succ)
		return workflow.NewContinueAsNewError(ctx, ProxyWorkflow, next)
	}
	w.log.Info("proxy deleted", "uid", s.UID)
	return nil
}

// steady watches the proxy until something needs the workflow: a signal that changes the
// plan, a verdict or drift from the monitor, maxAge, or the retry time of a pending create.
func (w *proxyWorkflow) steady(ctx workflow.Context) error {
	s := w.state
	var wake time.Time
	var wakeReason string
	setWake := func(t time.Time, why string) {
		if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
			wake, wakeReason = t, why
		}
	}
	setWake(s.RetryAt, "retry")
	setWake(s.DeleteRetryAt, "retry-delete")
	if s.Instance.Running() && s.Spec.Lifecycle != nil && s.Spec.Lifecycle.MaxAge != nil {
		if age, err := s.Spec.Lifecycle.MaxAge.ParseDuration(0); err == nil && age > 0 {
			setWake(s.Instance.CreatedAt.Add(age), "maxAge")
		}
	}

	if grace := w.unhealthyGrace(); grace > 0 && s.Instance.Running() && s.Health.Known && !s.Health.Healthy {
		setWake(s.Health.Since.Add(grace), "unhealthy")
	}

	mctx, cancelMonitor := workflow.WithCancel(ctx)
	defer cancelMonitor()
	var monitor workflow.Future
	if in, ok := w.monitorInput(); ok {
		mctx = workflow.WithActivityOptions(mctx, workflow.ActivityOptions{
			Summary:             "watch " + in.Target,
			StartToCloseTimeout: 365 * 24 * time.Hour,
			HeartbeatTimeout:    monitorHeartbeatTimeout(in),
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
		})
		monitor = workflow.ExecuteActivity(mctx, a.Monitor, in)
	}
	var timer workflow.Future
	tctx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	if !wake.IsZero() {
		timer = workflow.NewTimerWithOptions(tctx, max(wake.Sub(workflow.Now(ctx)), 0), workflow.TimerOptions{Summary: wakeReason})
	}
	w.details(ctx, w.steadyReason(wake, wakeReason))

	for {
		var monitorDone, timerDone bool
		sel := workflow.NewSelector(ctx)
		w.addSignals(sel)
		if monitor != nil {
			sel.AddFuture(monitor, func(workflow.Future) { monitorDone = true })
		}
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timerDone = true })
		}
		sel.Select(ctx)
		switch {
		case w.interrupt:
			return nil
		case w.memoDirty && !monitorDone && !timerDone:
			// A report: publish the cooldowns and keep watching.
			if err := w.publishState(ctx); err != nil {
				return err
			}
			continue
		case timerDone:
			if s.ReplaceReason == "" {
				switch wakeReason {
				case "maxAge":
					s.ReplaceReason = "maxAge"
				case "unhealthy":
					s.ReplaceReason = fmt.Sprintf("unhealthy for %s", w.unhealthyGrace())
				}
			}
			return nil
		case monitorDone:
			var res activities.MonitorResult
			if err := monitor.Get(ctx, &res); err != nil {
				// Only a bug or a config the schema should have refused ends up here.
				w.log.Error("monitor failed", "error", err)
				s.Health.LastFailure = errorMessage(err)
				return w.sleep(ctx, w.backoff(1))
			}
			w.onMonitor(ctx, res)
			return nil
		}
	}
}

// unhealthyGrace is spec.lifecycle.unhealthyReplaceAfter, or 0 when health-driven
// replacement is off.
func (w *proxyWorkflow) unhealthyGrace() time.Duration {
	l := w.state.Spec.Lifecycle
	if l == nil || l.UnhealthyReplaceAfter == nil {
		return 0
	}
	d, err := l.UnhealthyReplaceAfter.ParseDuration(0)
	if err != nil {
		return 0
	}
	return d
}

func (w *proxyWorkflow) onMonitor(ctx workflow.Context, res activities.MonitorResult) {
	s := w.state
	prev := s.Health
	s.Health = res.Health
	if res.Reason == activities.MonitorVerdict && (prev.Known != res.Health.Known || prev.Healthy != res.Health.Healthy) {
		// Grace periods count in workflow time, which replays exactly.
		s.Health.Since = workflow.Now(ctx)
	} else {
		s.Health.Since = prev.Since
	}
	switch res.Reason {
	case activities.MonitorGone, activities.MonitorStopped:
		if s.Instance != nil {
			w.log.Warn("instance lost; recreating", "instance", s.Instance.Name, "reason", res.Reason)
			s.Retiring = append(s.Retiring, *s.Instance)
			s.Instance = nil
			s.Health = activities.Health{Known: true, Healthy: false, Since: workflow.Now(ctx), LastFailure: "instance " + res.Reason}
		}
	}
}

func (w *proxyWorkflow) monitorInput() (activities.MonitorInput, bool) {
	s := w.state
	if s.Spec == nil || s.Deleting {
		return activities.MonitorInput{}, false
	}
	in := activities.MonitorInput{HealthCheck: s.Spec.HealthCheck, Last: s.Health, DriftInterval: w.tuning.DriftInterval}
	switch {
	case s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		in.Target = net.JoinHostPort(s.Spec.Endpoint.Host, strconv.Itoa(int(s.Spec.Endpoint.Port)))
	case s.Instance.Running():
		in.Target = net.JoinHostPort(s.Instance.IP, strconv.Itoa(int(s.Instance.Port)))
		ii := w.instanceInput(s.Instance)
		in.Instance = &ii
	default:
		return in, false
	}
	return in, true
}

func monitorHeartbeatTimeout(in activities.MonitorInput) time.Duration {
	interval, _ := in.HealthCheck.EffectiveInterval()
	timeout, _ := in.HealthCheck.EffectiveTimeout()
	return 2*interval + timeout + 10*time.Second
}

func (w *proxyWorkflow) sleep(ctx workflow.Context, d time.Duration) error {
	w.waitSignals(ctx, workflow.Now(ctx).Add(d))
	return nil
}

// --- failures ------------------------------------------------------------------------

// failed records an activity failure by its kind: quota is a slow retry, permanent latches
// Failed for this generation, a cloud-init problem waits for the Secret, anything else
// backs off exponentially.
func (w *proxyWorkflow) failed(ctx workflow.Context, err error) {
	s := w.state
	now := workflow.Now(ctx)
	msg := errorMessage(err)
	s.Attempt++
	switch {
	case isType(err, activities.ErrTypeQuota):
		s.Quota = msg
		s.RetryAt = now.Add(w.tuning.QuotaRetry)
	case isType(err, activities.ErrTypePermanent):
		s.Failure = &Failure{Generation: s.Generation, Message: msg}
	case isType(err, activities.ErrTypeCloudInit):
		s.CloudInitError = msg
		s.NeedHash = true
		s.RetryAt = now.Add(w.backoff(s.Attempt))
	default:
		s.LastError = msg
		s.RetryAt = now.Add(w.backoff(s.Attempt))
	}
	w.log.Warn("provisioning step failed", "error", err, "attempt", s.Attempt)
}

func (w *proxyWorkflow) succeeded() {
	s := w.state
	s.Attempt, s.LastError, s.Quota, s.RetryAt = 0, "", "", time.Time{}
}

// backoff is RetryBase·2^(attempt-1), capped at RetryMax.
func (w *proxyWorkflow) backoff(attempt int) time.Duration {
	d := w.tuning.RetryBase
	for i := 1; i < attempt && d < w.tuning.RetryMax; i++ {
		d *= 2
	}
	return min(d, w.tuning.RetryMax)
}

func isType(err error, typ string) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == typ
}

// errorMessage is the innermost application message, without Temporal's wrapping.
func errorMessage(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Message()
	}
	return err.Error()
}

// --- publishing ----------------------------------------------------------------------

// publishState writes what changed since the last write: the CR status (through a local
// activity), the search attributes and the memo.
func (w *proxyWorkflow) publishState(ctx workflow.Context) error {
	s := w.state
	if s.UID == "" {
		return nil
	}
	st := status(s, w.wfID)
	s.Phase = st.Phase
	if w.published == nil || !equalData(*w.published, st) {
		lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: 30 * time.Second,
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 10},
		})
		in := activities.PublishInput{Namespace: w.in.Namespace, Name: w.in.Name, UID: s.UID, Status: st}
		if err := workflow.ExecuteLocalActivity(lctx, a.PublishStatus, in).Get(ctx, nil); err != nil {
			// Status is a view; the workflow's state is the truth. Try again next change.
			w.log.Warn("publishing status failed", "error", err)
		} else {
			w.published = &st
		}
	}
	healthy := st.Phase == v1alpha1.PhaseReady
	memo := w.memoOf(st)
	unchanged := w.memo != nil && equalData(*w.memo, memo) && !w.memoDirty
	if unchanged && w.saPhase == st.Phase && w.saHealthy != nil && *w.saHealthy == healthy {
		return nil
	}
	err := workflow.UpsertTypedSearchAttributes(ctx,
		contract.SearchAttrPhase.ValueSet(string(st.Phase)),
		contract.SearchAttrProvider.ValueSet(w.providerName()),
		contract.SearchAttrHealthy.ValueSet(healthy),
		contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()),
	)
	if err != nil {
		return err
	}
	if err := workflow.UpsertMemo(ctx, map[string]any{contract.MemoKey: memo}); err != nil {
		return err
	}
	w.memo, w.saPhase, w.saHealthy, w.memoDirty = &memo, st.Phase, &healthy, false
	return nil
}

func (w *proxyWorkflow) providerName() string {
	s := w.state
	if s.Spec == nil {
		return ""
	}
	return s.Spec.ProviderLabel()
}

func (w *proxyWorkflow) memoOf(st v1alpha1.ProxyStatus) contract.ProxyMemo {
	s := w.state
	m := contract.ProxyMemo{
		Name: w.in.Name, Namespace: w.in.Namespace, UID: s.UID, Phase: string(st.Phase),
		Healthy: st.Phase == v1alpha1.PhaseReady, IP: st.IP, Port: st.Port,
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
	now := w.now()
	for _, target := range sortedKeys(s.Cooldowns) {
		if until := s.Cooldowns[target]; until.After(now) {
			if m.Cooldowns == nil {
				m.Cooldowns = map[string]time.Time{}
			}
			m.Cooldowns[target] = until
		}
	}
	return m
}

// --- words for people ----------------------------------------------------------------

// details sets the Web UI's "current details": why the workflow is waiting, in words.
func (w *proxyWorkflow) details(ctx workflow.Context, text string) {
	s := w.state
	prefix := fmt.Sprintf("**%s/%s** phase %s", w.in.Namespace, w.in.Name, phase(s))
	workflow.SetCurrentDetails(ctx, prefix+": "+text)
}

func (w *proxyWorkflow) idleReason() string {
	s := w.state
	switch {
	case s.Spec == nil:
		return "waiting for the Proxy's spec"
	case s.Failure != nil:
		return "failed permanently: " + s.Failure.Message + "; edit the Proxy to try again"
	}
	return "waiting for a signal"
}

func (w *proxyWorkflow) steadyReason(wake time.Time, why string) string {
	s := w.state
	var text string
	switch {
	case s.Quota != "":
		text = fmt.Sprintf("quota exceeded (%s); retry %d at %s", s.Quota, s.Attempt+1, wake.UTC().Format(time.RFC3339))
	case s.CloudInitError != "":
		text = fmt.Sprintf("cloud-init Secret unusable (%s); retry at %s", s.CloudInitError, wake.UTC().Format(time.RFC3339))
	case s.LastError != "" && !wake.IsZero():
		text = fmt.Sprintf("last attempt failed (%s); retry %d at %s", s.LastError, s.Attempt+1, wake.UTC().Format(time.RFC3339))
	case s.Health.Known && !s.Health.Healthy:
		text = "unhealthy: " + s.Health.LastFailure
	case s.Health.Known:
		text = fmt.Sprintf("healthy (%dms)", s.Health.LatencyMillis)
	default:
		text = "waiting for the first health verdict"
	}
	switch why {
	case "maxAge":
		text += "; replaced at maxAge " + wake.UTC().Format(time.RFC3339)
	case "unhealthy":
		text += "; replaced if still unhealthy at " + wake.UTC().Format(time.RFC3339)
	}
	return text
}

// --- continue-as-new -----------------------------------------------------------------

func (w *proxyWorkflow) shouldContinueAsNew(ctx workflow.Context) bool {
	info := workflow.GetInfo(ctx)
	if info.GetContinueAsNewSuggested() {
		return true
	}
	return w.tuning.HistoryLimit > 0 && info.GetCurrentHistoryLength() >= w.tuning.HistoryLimit
}

func (w *proxyWorkflow) continueAsNew(ctx workflow.Context) error {
	w.drainSignals()
	next := w.in
	next.State = w.state
	w.log.Info("continuing as new", "historyLength", workflow.GetInfo(ctx).GetCurrentHistoryLength())
	return workflow.NewContinueAsNewError(ctx, ProxyWorkflow, next)
}

// equalData compares plain values (no funcs, channels or pointers to shared state). Deep
// equality of data is deterministic; workflowcheck flags reflect only because reflection
// can allocate.
//
//workflowcheck:ignore
func equalData(x, y any) bool { return reflect.DeepEqual(x, y) }
