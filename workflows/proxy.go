package workflows

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
		monCh:  workflow.GetSignalChannel(ctx, contract.SignalMonitor),
		now:    func() time.Time { return workflow.Now(ctx) },
		state:  in.State,
		wfID:   workflow.GetInfo(ctx).WorkflowExecution.ID,
	}
	if w.state == nil {
		w.state = &ProxyState{}
	}
	w.policy = policyFor(workflow.GetVersion(ctx, versionChangeID, workflow.DefaultVersion, versionLatest))
	w.cost = costStart
	w.runStart = workflow.Now(ctx)
	w.state.policy = w.policy
	if in.State == nil && w.policy.bounded() {
		w.state.Unlisted = true
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
	// monCh carries a monitor shard's reports (MonitorReport). Runs of version 4 read it
	// only while steady (where the old Monitor activity's results were applied); later
	// ones in every wait (addSignals), since a step can last minutes (a delete tries for
	// up to 15) and a verdict must not wait for it.
	monCh workflow.ReceiveChannel
	// reported is set when a report was applied by addSignals: steady then returns to
	// replan, as it did when it read reports itself. watchLeft is set when a report moved
	// the run off the watch it published (see reportStale), until the next publish.
	reported  bool
	watchLeft bool
	// urgent is set when what discovery acts on changed (a verdict, an instance): await
	// publishes it at once; other memo changes (cooldowns) at most every
	// awaitPublishEvery. publishedAt is when the memo was last written.
	urgent      bool
	publishedAt time.Time
	now         func() time.Time
	// policy is what the version this run started with decides; runStart is when;
	// signals counts the signals it received. Together they decide when the run has done
	// enough.
	policy   runPolicy
	runStart time.Time
	signals  int
	// cost is an upper bound on the history events this run has written, counted from
	// what it did (see the cost constants). It bounds a run where the server's count is not
	// available, and is the budget the tests can check.
	cost int
	// memoDirty is set by a report: cooldowns changed and discovery must see them.
	memoDirty bool

	// interrupt is set by a signal that changes what plan() would choose.
	interrupt bool
	// republishAt is when to try again to write a status the API server refused (zero: no
	// write pending); publishFailures counts the failures in a row.
	republishAt     time.Time
	publishFailures int
	// published and memo remember what was last written, so nothing is written twice.
	published *v1alpha1.ProxyStatus
	memo      *contract.ProxyMemo
	saPhase   v1alpha1.Phase
	saHealthy *bool
	// watchEpoch is the epoch of the MonitorMemo last published ("" for none); watchSet
	// says one was published by this run. A shard's report for another epoch is stale.
	watchEpoch string
	watchSet   bool
	// verdictPub is the Verdict last published (nil: none).
	verdictPub *activities.Verdict
	// wake is steady's pending timer. A run watched by shards keeps it across the reports
	// that end one steady wait and start the next: a verdict or a latency that leaves the
	// wake time as it was would otherwise cancel the timer and start the same one again,
	// two events and a billable action each time.
	wake pendingWake
}

// pendingWake is a timer steady started, and what for.
type pendingWake struct {
	at     time.Time
	reason string
	timer  workflow.Future
	cancel workflow.CancelFunc
}

func (w *proxyWorkflow) run(ctx workflow.Context) error {
	s := w.state
	for {
		w.drainSignals()
		if err := w.publishState(ctx); err != nil {
			return err
		}
		if over, why := w.overBudget(ctx); over {
			return w.continueAsNew(ctx, why)
		}
		w.interrupt = false
		now := workflow.Now(ctx)
		st := plan(s, now)
		var err error
		switch st {
		case stepIdle:
			w.details(ctx, w.idleReason())
			if w.policy.bounded() {
				err = w.waitSignals(ctx, w.runEnd())
			} else {
				err = w.waitSignals(ctx, time.Time{})
			}
		case stepFinish:
			if done, err := w.finish(ctx); done || err != nil {
				return err
			}
		case stepDelete:
			err = w.deleteRetiring(ctx)
		case stepHash:
			err = w.hash(ctx)
		case stepList:
			err = w.list(ctx)
		case stepCreate:
			err = w.create(ctx, s.ensureInstance(now))
		case stepRetireCurrent:
			s.retireCurrent()
		case stepWaitRunning:
			err = w.waitRunning(ctx, s.Instance.Name)
		case stepCreateNext:
			err = w.create(ctx, s.ensureNext(now))
		case stepRetireNext:
			s.retireNext()
		case stepWaitNext:
			err = w.waitRunning(ctx, s.Next.Name)
		case stepVerifyNext:
			err = w.verifyNext(ctx)
		case stepPromote:
			w.apply(s.promote(now))
		case stepSteady:
			err = w.steady(ctx)
		}
		if err != nil {
			return err
		}
	}
}

func (w *proxyWorkflow) instanceInput(ref *InstanceRef) activities.InstanceInput {
	return activities.InstanceInput{
		Provider: ref.Provider, Name: ref.Name, ProxyUID: w.state.UID, Namespace: w.in.Namespace,
		Spec: ref.Spec, ProviderID: ref.ProviderID, SpecHash: ref.Hash,
		PollInterval: w.tuning.PollInterval, MaxWait: w.tuning.WaitRunningMax,
	}
}

// --- signals -------------------------------------------------------------------------

func (w *proxyWorkflow) addSignals(sel workflow.Selector) {
	sel.AddReceive(w.specCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig SpecSignal
		c.ReceiveAsync(&sig)
		w.signals++
		w.cost += costSignal
		w.apply(w.state.applySpec(sig))
	})
	sel.AddReceive(w.delCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.DeleteSignal
		c.ReceiveAsync(&sig)
		w.signals++
		w.cost += costSignal
		w.apply(w.state.requestDelete(sig))
	})
	sel.AddReceive(w.repCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.ReportSignal
		c.ReceiveAsync(&sig)
		w.signals++
		w.cost += costSignal
		w.apply(w.state.report(sig, w.now()))
	})
	sel.AddReceive(w.replCh, func(c workflow.ReceiveChannel, _ bool) {
		var sig contract.ReplaceSignal
		c.ReceiveAsync(&sig)
		w.signals++
		w.cost += costSignal
		w.apply(w.state.requestReplace(sig))
	})
	if w.policy.serveWhileReplacing {
		sel.AddReceive(w.monCh, func(c workflow.ReceiveChannel, _ bool) {
			if r := w.receiveReport(c); r != nil {
				w.applyReport(r)
			}
		})
	}
}

// applyReport applies a shard's report in whatever step the run is. A changed verdict or
// address is published at the next chance (await and the waits publish a dirty memo); an
// instance lost behind the run's back changes the plan, so an interruptible step stops.
func (w *proxyWorkflow) applyReport(r *activities.MonitorReport) {
	s := w.state
	before := s.Health
	inst := s.Instance
	e := s.monitorReturned(r.Result, w.now())
	w.apply(e)
	w.reported = true
	if s.Instance != inst {
		w.interrupt, w.watchLeft, w.urgent = true, true, true
	}
	if before.Known != s.Health.Known || before.Healthy != s.Health.Healthy || before.FailureReason != s.Health.FailureReason {
		w.urgent = true
	}
	if e.publish || w.urgent || before.LatencyMillis != s.Health.LatencyMillis || before.LastFailure != s.Health.LastFailure {
		w.memoDirty = true
	}
}

// drainSignals applies every signal already received, without blocking.
func (w *proxyWorkflow) drainSignals() {
	s := w.state
	for {
		var spec SpecSignal
		var del contract.DeleteSignal
		var repl contract.ReplaceSignal
		var rep contract.ReportSignal
		switch {
		case w.specCh.ReceiveAsync(&spec):
			w.apply(s.applySpec(spec))
		case w.delCh.ReceiveAsync(&del):
			w.apply(s.requestDelete(del))
		case w.replCh.ReceiveAsync(&repl):
			w.apply(s.requestReplace(repl))
		case w.repCh.ReceiveAsync(&rep):
			w.apply(s.report(rep, w.now()))
		case w.policy.serveWhileReplacing && w.monCh.Len() > 0:
			// receiveReport counts the signal itself.
			if r := w.receiveReport(w.monCh); r != nil {
				w.applyReport(r)
			}
			continue
		default:
			return
		}
		w.signals++
		w.cost += costSignal
	}
}

// apply carries out what a transition of the core asks of the loop.
func (w *proxyWorkflow) apply(e effect) {
	if e.replan {
		w.interrupt = true
	}
	if e.publish {
		w.memoDirty = true
	}
	switch {
	case e.note == "":
	case e.warn:
		w.log.Warn(e.note, "uid", w.state.UID)
	default:
		w.log.Info(e.note, "uid", w.state.UID)
	}
}

// --- waiting -------------------------------------------------------------------------

// waitSignals blocks until a signal changes the plan or until (if set) passes. Reports are
// published as they come, and a run over its budget returns to continue as new.
func (w *proxyWorkflow) waitSignals(ctx workflow.Context, until time.Time) error {
	var timerDone bool
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	var timer workflow.Future
	if !until.IsZero() {
		timer = w.timer(tctx, until.Sub(workflow.Now(ctx)), workflow.TimerOptions{Summary: "back off before retrying"})
	}
	republish := w.republishTimer(tctx)
	for !w.interrupt && !timerDone {
		republishDue := false
		sel := workflow.NewSelector(ctx)
		w.addSignals(sel)
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timerDone = true })
		}
		if republish != nil {
			sel.AddFuture(republish, func(workflow.Future) { republishDue = true })
		}
		sel.Select(ctx)
		if w.policy.legacy {
			continue
		}
		if republishDue {
			if err := w.publishState(ctx); err != nil {
				return err
			}
			republish = w.republishTimer(tctx)
		}
		if w.memoDirty {
			if err := w.publishState(ctx); err != nil {
				return err
			}
		}
		if over, _ := w.overBudget(ctx); over {
			return nil
		}
	}
	return nil
}

// await waits for an activity future. While it runs, signals are applied; if one changes
// the plan and the activity may be abandoned, its context is cancelled. It reports whether
// the activity was interrupted.
func (w *proxyWorkflow) await(ctx workflow.Context, fut workflow.Future, cancel workflow.CancelFunc, interruptible bool, result any) (bool, error) {
	pctx, cancelPublish := workflow.WithCancel(ctx)
	defer cancelPublish()
	var publishTimer workflow.Future
	for {
		done, publishDue := false, false
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(fut, func(workflow.Future) { done = true })
		w.addSignals(sel)
		if publishTimer != nil {
			sel.AddFuture(publishTimer, func(workflow.Future) { publishDue, publishTimer = true, nil })
		}
		sel.Select(ctx)
		if done {
			return false, fut.Get(ctx, result)
		}
		over := false
		if w.policy.bounded() {
			over, _ = w.overBudget(ctx)
		}
		if w.policy.serveWhileReplacing && w.memoDirty && !over {
			// A verdict while a step runs (a delete can take 15 minutes a try) reaches
			// discovery now, not when the step ends; cooldowns follow within
			// awaitPublishEvery, so crawlers' reports cannot make one write each. A run
			// over its budget writes nothing more until the step ends and it continues.
			next := w.publishedAt.Add(awaitPublishEvery)
			switch {
			case w.urgent || publishDue || !workflow.Now(ctx).Before(next):
				if err := w.publishState(ctx); err != nil {
					return false, err
				}
			case publishTimer == nil:
				publishTimer = w.timer(pctx, next.Sub(workflow.Now(ctx)), workflow.TimerOptions{Summary: "publish what crawlers reported"})
			}
		}
		if !interruptible {
			continue
		}
		if w.interrupt || over {
			if w.policy.serveWhileReplacing && fut.IsReady() {
				// The result is here already: a replacement's verdict, say, which the
				// instance that took over from it goes on with.
				return false, fut.Get(ctx, result)
			}
			cancel()
			_ = fut.Get(ctx, nil)
			return true, nil
		}
	}
}

// awaitPublishEvery is how often, at most, await writes memo changes that are not verdicts
// (cooldowns crawlers report) while an activity runs.
const awaitPublishEvery = 30 * time.Second

// --- steps ---------------------------------------------------------------------------

// list finds the instances earlier runs of this Proxy left; the core adopts or retires them.
// A failure, of any kind, is retried with backoff: nothing is created until the list is
// known, or an earlier instance could be left behind.
func (w *proxyWorkflow) list(ctx workflow.Context) error {
	s := w.state
	w.details(ctx, "looking for instances that earlier runs of this Proxy left")
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		Summary:             "find instances labelled with uid " + s.UID,
		StartToCloseTimeout: w.tuning.ActivityTimeout,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second, MaximumAttempts: 5},
	})
	var found activities.FindResult
	in := activities.FindInput{ProxyUID: s.UID, Namespace: w.in.Namespace, Name: w.in.Name}
	if s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeManaged {
		in.Provider = s.Spec.Provider
		if s.Spec.GCP != nil {
			in.Project = s.Spec.GCP.Project
		}
	}
	_, err := w.await(ctx, w.activity(actx, a.FindInstances, in), func() {}, false, &found)
	if !s.Unlisted || s.UID != in.ProxyUID {
		// A spec for another object arrived meanwhile: these instances are not its own
		// (the old object's were retired with its state; its sweep is GC's).
		return nil
	}
	if err != nil {
		w.apply(s.failed(failTransient, "finding instances of earlier runs: "+errorMessage(err), workflow.Now(ctx), w.tuning))
		return nil
	}
	w.apply(s.adopt(found, workflow.Now(ctx)))
	return nil
}

func (w *proxyWorkflow) hash(ctx workflow.Context) error {
	s := w.state
	ref := s.Spec.CloudInit.SecretRef
	w.details(ctx, fmt.Sprintf("reading cloud-init Secret %s/%s", w.in.Namespace, ref.Name))
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 5, NonRetryableErrorTypes: []string{activities.ErrTypeCloudInit}},
	})
	var h string
	err := w.local(lctx, a.HashCloudInit, activities.HashInput{Namespace: w.in.Namespace, Ref: ref}).Get(ctx, &h)
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	s.hashed(h)
	return nil
}

func (w *proxyWorkflow) create(ctx workflow.Context, name string) error {
	ref := w.state.find(name)
	text := fmt.Sprintf("creating instance %s (%s)", name, ref.Provider)
	for _, r := range w.state.Retiring {
		if r.Lost {
			// The Web UI says why a Proxy is being rebuilt: e.g. its Spot VM was preempted.
			text += fmt.Sprintf("; %s was lost (%s)", r.Name, cmp.Or(r.LostReason, "gone"))
		}
	}
	w.details(ctx, text)
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
	_, err := w.await(ctx, w.activity(actx, a.CreateInstance, w.instanceInput(ref)), func() {}, false, &res)
	if err != nil {
		kind, msg := failureOf(err)
		w.apply(w.state.createFailed(name, kind, msg, workflow.Now(ctx), w.tuning))
		return nil
	}
	w.state.created(name, res)
	return nil
}

func (w *proxyWorkflow) waitRunning(ctx workflow.Context, name string) error {
	ref := w.state.find(name)
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
	interrupted, err := w.await(ctx, w.activity(actx, a.WaitRunning, w.instanceInput(ref)), cancel, true, &res)
	if interrupted {
		return nil
	}
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	e := w.state.waited(name, res)
	w.apply(e)
	if e.lost && w.policy.bounded() {
		w.state.lostWhileProvisioning(name, workflow.Now(ctx), w.tuning)
	}
	return nil
}

// verifyNext probes the replacement until it has a verdict; the core decides what the
// verdict means.
func (w *proxyWorkflow) verifyNext(ctx workflow.Context) error {
	s := w.state
	next := s.Next
	w.details(ctx, fmt.Sprintf("checking replacement %s through itself before switching", next.Name))
	in := activities.MonitorInput{
		Target:      net.JoinHostPort(next.IP, strconv.Itoa(int(next.Port))),
		HealthCheck: s.Spec.HealthCheck,
		Auth:        managedAuth(next),
	}
	actx, cancel := workflow.WithCancel(ctx)
	actx = workflow.WithActivityOptions(actx, workflow.ActivityOptions{
		Summary:             "check replacement " + next.Name + " through itself",
		StartToCloseTimeout: 30 * time.Minute,
		HeartbeatTimeout:    monitorHeartbeatTimeout(in),
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	var res activities.MonitorResult
	interrupted, err := w.await(ctx, w.activity(actx, a.Monitor, in), cancel, true, &res)
	if interrupted {
		return nil
	}
	if err != nil {
		w.failed(ctx, err)
		return nil
	}
	w.apply(s.verified(next.Name, res.Health, workflow.Now(ctx), w.tuning))
	return nil
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
	_, err := w.await(ctx, w.activity(actx, a.DeleteInstance, w.instanceInput(&ref)), func() {}, false, nil)
	if err != nil {
		s.deleteFailed(errorMessage(err), workflow.Now(ctx), w.tuning)
		w.log.Warn("delete failed; will retry", "instance", ref.Name, "error", err)
		return nil
	}
	s.deleted(ref.Name)
	return nil
}

// finish releases the Proxy's finalizer once every instance is gone, and reports whether
// the workflow is done. If the API server refuses for longer than the local activity's
// retries, it waits and tries again (a run of an older version failed instead); a run that
// reaches its budget meanwhile continues as new and tries again there.
func (w *proxyWorkflow) finish(ctx workflow.Context) (bool, error) {
	s := w.state
	w.details(ctx, "instances deleted; releasing the Proxy's finalizer")
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second},
	})
	ref := activities.ObjectRef{Namespace: w.in.Namespace, Name: w.in.Name, UID: s.UID}
	for attempt := 1; ; attempt++ {
		err := w.local(lctx, a.ReleaseFinalizer, ref).Get(ctx, nil)
		if err == nil {
			break
		}
		if w.policy.legacy {
			return true, err
		}
		w.log.Warn("releasing the finalizer failed; will try again", "attempt", attempt, "error", err)
		w.details(ctx, fmt.Sprintf("instances deleted; releasing the Proxy's finalizer failed (%s), attempt %d", errorMessage(err), attempt))
		if err := w.sleep(ctx, w.tuning.Backoff(attempt)); err != nil {
			return false, err
		}
		if over, _ := w.overBudget(ctx); over {
			return false, nil
		}
	}
	w.drainSignals()
	if s.Successor != nil {
		// A new object took this name while we were deleting: start over for it.
		next := w.in
		next.State = s.successor()
		w.state = next.State
		return true, workflow.NewContinueAsNewError(ctx, ProxyWorkflow, next)
	}
	w.log.Info("proxy deleted", "uid", s.UID)
	return true, nil
}

// steady watches the proxy until something needs the workflow: a signal that changes the
// plan, a verdict or drift from the monitor, or a time the core asked to wake at.
func (w *proxyWorkflow) steady(ctx workflow.Context) error {
	s := w.state
	wake, wakeReason := s.nextWake()
	if end := w.runEnd(); w.policy.bounded() && (wake.IsZero() || end.Before(wake)) {
		wake, wakeReason = end, wakeRunAge
	}

	mctx, cancelMonitor := workflow.WithCancel(ctx)
	defer cancelMonitor()
	var monitor workflow.Future
	sharded := w.policy.shardWatched
	if in, ok := w.monitorInput(); ok && !sharded {
		mctx = workflow.WithActivityOptions(mctx, workflow.ActivityOptions{
			Summary:             "watch " + in.Target,
			StartToCloseTimeout: 365 * 24 * time.Hour,
			HeartbeatTimeout:    monitorHeartbeatTimeout(in),
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
		})
		monitor = w.activity(mctx, a.Monitor, in)
	}
	tctx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	var timer workflow.Future
	if sharded {
		timer = w.wakeTimer(ctx, wake, wakeReason)
	} else if !wake.IsZero() {
		timer = w.timer(tctx, max(wake.Sub(workflow.Now(ctx)), 0), workflow.TimerOptions{Summary: wakeReason})
	}
	w.details(ctx, w.steadyReason(wake, wakeReason))
	republish := w.republishTimer(tctx)
	// A report applied before this wait is already in the state it planned from.
	w.reported = false

	for {
		var monitorDone, timerDone, republishDue bool
		var report *activities.MonitorReport
		sel := workflow.NewSelector(ctx)
		w.addSignals(sel)
		if monitor != nil {
			sel.AddFuture(monitor, func(workflow.Future) { monitorDone = true })
		}
		if sharded && !w.policy.serveWhileReplacing {
			// Later versions take reports in addSignals, in every step.
			sel.AddReceive(w.monCh, func(c workflow.ReceiveChannel, _ bool) { report = w.receiveReport(c) })
		}
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timerDone = true })
		}
		if republish != nil {
			sel.AddFuture(republish, func(workflow.Future) { republishDue = true })
		}
		sel.Select(ctx)
		switch {
		case w.interrupt:
			return nil
		case republishDue:
			if err := w.publishState(ctx); err != nil {
				return err
			}
			republish = w.republishTimer(tctx)
		case w.memoDirty && !monitorDone && !timerDone && report == nil && !w.reported:
			// A report: publish the cooldowns and keep watching.
			if err := w.publishState(ctx); err != nil {
				return err
			}
		case timerDone:
			w.wake = pendingWake{}
			s.woke(wakeReason)
			return nil
		case monitorDone:
			var res activities.MonitorResult
			if err := monitor.Get(ctx, &res); err != nil {
				// Only a bug or a config the schema should have refused ends up here.
				w.log.Error("monitor failed", "error", err)
				s.monitorFailed(errorMessage(err))
				return w.sleep(ctx, w.tuning.Backoff(1))
			}
			w.apply(s.monitorReturned(res, workflow.Now(ctx)))
			return nil
		case report != nil:
			w.apply(s.monitorReturned(report.Result, workflow.Now(ctx)))
			return nil
		case w.reported:
			// addSignals applied a report: replan with it, as above.
			w.reported = false
			return nil
		}
		if w.policy.bounded() {
			if over, _ := w.overBudget(ctx); over {
				return nil
			}
		}
	}
}

// wakeTimer is the timer of steady's wake at at (zero: none): the pending one if it is for
// the same time and reason, else a new one, the old one cancelled. It outlives the steady
// wait that started it; one that fired while the run was elsewhere is ready at once.
func (w *proxyWorkflow) wakeTimer(ctx workflow.Context, at time.Time, reason string) workflow.Future {
	if w.wake.timer != nil && w.wake.at.Equal(at) && w.wake.reason == reason {
		return w.wake.timer
	}
	if w.wake.cancel != nil {
		w.wake.cancel()
	}
	w.wake = pendingWake{}
	if at.IsZero() {
		return nil
	}
	tctx, cancel := workflow.WithCancel(ctx)
	w.wake = pendingWake{at: at, reason: reason, cancel: cancel,
		timer: w.timer(tctx, max(at.Sub(workflow.Now(ctx)), 0), workflow.TimerOptions{Summary: reason})}
	return w.wake.timer
}

// receiveReport takes one shard report off c: it returns it if it is about what the run
// watches now, or nil if it is stale (about an instance since replaced, a health check
// since changed), which is dropped.
func (w *proxyWorkflow) receiveReport(c workflow.ReceiveChannel) *activities.MonitorReport {
	var r activities.MonitorReport
	c.ReceiveAsync(&r)
	w.signals++
	w.cost += costSignal
	if w.reportStale(r.Epoch) {
		w.log.Info("dropped a stale monitor report", "uid", w.state.UID, "epoch", r.Epoch, "reason", r.Result.Reason)
		return nil
	}
	return &r
}

// reportStale reports whether a shard's report for epoch is about something the run no
// longer watches. Runs of version 4 take only the epoch they last published. Later ones,
// which read reports in every step, also take the epoch of what they watch now: before
// their first publish, a continued run carries on its predecessor's watch, and a report
// for it may already be waiting. And they stop taking the published epoch once a report
// moved the run off it (the instance was lost): a second copy of that report (reports are
// delivered at least once) must not be applied to the instance that took over.
func (w *proxyWorkflow) reportStale(epoch string) bool {
	if epoch == "" {
		return true
	}
	if !w.policy.serveWhileReplacing {
		return !w.watchSet || epoch != w.watchEpoch
	}
	if w.watchSet && epoch == w.watchEpoch && !w.watchLeft {
		return false
	}
	cur := w.watch()
	return cur == nil || cur.Epoch != epoch
}

// watch is what a monitor shard is to watch for this proxy now, or nil for nothing.
func (w *proxyWorkflow) watch() *activities.MonitorMemo {
	in, ok := w.monitorInput()
	if !ok {
		return nil
	}
	if in.Instance != nil {
		// The shard needs only where the instance is. Kept out: what it would repeat
		// (the health check) or never use (attributes, lifecycle), which would make every
		// memo write larger for discovery to read, and restart the watch on an edit that
		// changes nothing it does.
		ii := *in.Instance
		spec := ii.Spec
		ii.Spec = v1alpha1.ProxySpec{Mode: spec.Mode, Provider: spec.Provider, Port: spec.Port,
			GCP: spec.GCP, Kubernetes: spec.Kubernetes, Local: spec.Local}
		ii.PollInterval, ii.MaxWait, ii.SpecHash = 0, 0, ""
		in.Instance = &ii
	}
	return &activities.MonitorMemo{Epoch: watchEpoch(in), Input: in}
}

// verdictOf is the verdict to publish beside watch: the run's, for watch's epoch; nil if
// there is no watch or no verdict yet.
func (w *proxyWorkflow) verdictOf(watch *activities.MonitorMemo) *activities.Verdict {
	h := w.state.Health
	if watch == nil || !h.Known {
		return nil
	}
	v := &activities.Verdict{Epoch: watch.Epoch, Healthy: h.Healthy, Since: h.Since, LatencyMillis: h.LatencyMillis}
	if w.policy.serveWhileReplacing {
		// A member that starts later (its shard moved) must know the reason the run holds,
		// or it could never report it gone (a health-check target judged down).
		v.FailureReason = h.FailureReason
	}
	return v
}

// watchEpoch names a watch by everything in it but the last verdict (which the shard
// carries on by itself): the same watch published again, by this run or the next, is the
// same epoch, and the shard keeps watching without a pause. Whether a verdict is known at
// all is part of it: a run that starts knowing nothing (after a terminate, adopting the
// instance) must be told the verdict that the shard already gave the run before it. JSON of plain data is the same
// bytes on every replay (struct fields in order, map keys sorted); workflowcheck flags the
// encoder only for its type cache.
//
//workflowcheck:ignore
func watchEpoch(in activities.MonitorInput) string {
	in.Last = activities.Health{Known: in.Last.Known}
	b, err := json.Marshal(in)
	if err != nil {
		// Plain data always encodes; if it did not, every report would look stale.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
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

// managedAuth is how a Managed instance's credentials are found: derived from its key and
// name. An instance built before instances had credentials has no key and takes none.
func managedAuth(ref *InstanceRef) *activities.ProbeAuth {
	if ref == nil || ref.KeyID == "" {
		return nil
	}
	return &activities.ProbeAuth{KeyID: ref.KeyID, Instance: ref.Name}
}

func monitorHeartbeatTimeout(in activities.MonitorInput) time.Duration {
	interval, _ := in.HealthCheck.EffectiveInterval()
	timeout, _ := in.HealthCheck.EffectiveTimeout()
	return 2*interval + timeout + 10*time.Second
}

func (w *proxyWorkflow) sleep(ctx workflow.Context, d time.Duration) error {
	return w.waitSignals(ctx, workflow.Now(ctx).Add(d))
}

// --- failures ------------------------------------------------------------------------

// failed hands an activity failure to the core.
func (w *proxyWorkflow) failed(ctx workflow.Context, err error) {
	kind, msg := failureOf(err)
	w.apply(w.state.failed(kind, msg, workflow.Now(ctx), w.tuning))
}

// failureOf maps an activity error to what the core acts on.
func failureOf(err error) (failKind, string) {
	msg := errorMessage(err)
	switch {
	case isType(err, activities.ErrTypeQuota):
		return failQuota, msg
	case isType(err, activities.ErrTypePermanent):
		return failPermanent, msg
	case isType(err, activities.ErrTypeCloudInit):
		return failCloudInit, msg
	}
	return failTransient, msg
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
		if err := w.local(lctx, a.PublishStatus, in).Get(ctx, nil); err != nil {
			// Status is a view; the workflow's state is the truth. A run of an older version
			// tries again at its next change; this one also on a timer of its own, so the
			// status is right again soon after the API server is back.
			w.log.Warn("publishing status failed; will try again", "error", err)
			if w.policy.bounded() {
				w.publishFailures++
				w.republishAt = workflow.Now(ctx).Add(min(republishBase<<min(w.publishFailures-1, 6), republishMax))
			}
		} else {
			w.published = &st
			w.publishFailures, w.republishAt = 0, time.Time{}
		}
	}
	healthy := w.leasable(st)
	memo := w.memoOf(st)
	fields := map[string]any{contract.MemoKey: memo}
	var watch *activities.MonitorMemo
	var verdict *activities.Verdict
	sameVerdict := true
	if w.policy.shardWatched {
		watch = w.watch()
		// Written only when it changes (memo fields not written keep their value), so the
		// many writes of a flapping proxy carry only what discovery reads; the verdict in
		// it is the one of its epoch's start (or of the run's), which is all a shard that
		// takes over needs. A nil value removes the field: nothing to watch.
		switch {
		case w.sameWatch(watch):
		case watch != nil:
			fields[activities.MonitorMemoKey] = watch
		default:
			fields[activities.MonitorMemoKey] = nil
		}
		// The verdict it holds now, which a shard's member started later (its shard moved,
		// its worker restarted) starts from. It changes with what discovery's memo carries
		// too (health, latency), so it adds bytes to writes made anyway.
		verdict = w.verdictOf(watch)
		sameVerdict = equalData(verdict, w.verdictPub)
		switch {
		case sameVerdict:
		case verdict != nil:
			fields[activities.VerdictMemoKey] = verdict
		default:
			fields[activities.VerdictMemoKey] = nil // removed, as the watch is
		}
	}
	unchanged := w.memo != nil && equalData(*w.memo, memo) && !w.memoDirty && w.sameWatch(watch) && sameVerdict
	if unchanged && w.saPhase == st.Phase && w.saHealthy != nil && *w.saHealthy == healthy {
		return nil
	}
	w.cost += 2 * costUpsert
	err := workflow.UpsertTypedSearchAttributes(ctx,
		contract.SearchAttrPhase.ValueSet(string(st.Phase)),
		contract.SearchAttrProvider.ValueSet(w.providerName()),
		contract.SearchAttrHealthy.ValueSet(healthy),
		contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()),
	)
	if err != nil {
		return err
	}
	// The update time is what monitor shards and discovery read changes by, so the memo is
	// never written without it.
	if err := workflow.UpsertMemo(ctx, fields); err != nil {
		return err
	}
	w.memo, w.saPhase, w.saHealthy, w.memoDirty = &memo, st.Phase, &healthy, false
	w.publishedAt, w.urgent = workflow.Now(ctx), false
	if w.policy.shardWatched {
		w.verdictPub = verdict
		w.watchSet, w.watchEpoch, w.watchLeft = true, "", false
		if watch != nil {
			w.watchEpoch = watch.Epoch
		}
	}
	return nil
}

// sameWatch reports whether watch is what this run last published (always true for a run
// of a version that is not watched by shards).
func (w *proxyWorkflow) sameWatch(watch *activities.MonitorMemo) bool {
	if !w.policy.shardWatched {
		return true
	}
	epoch := ""
	if watch != nil {
		epoch = watch.Epoch
	}
	return w.watchSet && epoch == w.watchEpoch
}

func (w *proxyWorkflow) providerName() string {
	s := w.state
	if s.Spec == nil {
		return ""
	}
	return s.Spec.ProviderLabel()
}

// leasable is whether discovery may lease the proxy: it is Ready, or (from version 5) it is
// being replaced and the instance that serves until the replacement is verified is
// healthy. Make-before-break is for crawlers too: the old instance leaves the pool when
// the new one takes its place, not when the new one is started.
func (w *proxyWorkflow) leasable(st v1alpha1.ProxyStatus) bool {
	s := w.state
	if st.Phase == v1alpha1.PhaseReady {
		return true
	}
	return w.policy.serveWhileReplacing && st.Phase == v1alpha1.PhaseReplacing &&
		s.Instance.Running() && s.Health.Known && s.Health.Healthy
}

func (w *proxyWorkflow) memoOf(st v1alpha1.ProxyStatus) contract.ProxyMemo {
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
				// The Secret has not been read yet (it was just named, or cannot be found):
				// leased now, the proxy would be handed out without the credentials it needs.
				m.Healthy = false
			}
		}
	case s.Instance != nil && s.Instance.KeyID != "":
		m.Auth = &contract.ProxyAuth{KeyID: s.Instance.KeyID, Instance: s.Instance.Name}
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
	case wakeMaxAge:
		text += "; replaced at maxAge " + wake.UTC().Format(time.RFC3339)
	case wakeUnhealthy:
		text += "; replaced if still unhealthy at " + wake.UTC().Format(time.RFC3339)
	case wakeRunAge:
		text += "; this run continues as new at " + wake.UTC().Format(time.RFC3339)
	}
	return text
}

// --- continue-as-new -----------------------------------------------------------------

// How soon a status the API server refused is written again: 30s, doubling to 5 minutes.
// The local activity itself already retried for about a minute.
const (
	republishBase = 30 * time.Second
	republishMax  = 5 * time.Minute
)

// republishTimer starts the timer of the next status write, if one is pending, or returns
// nil. The steady and idle waits select on it, so a status that could not be written (the
// API server was down) is written once it is back, without waiting for the next change.
func (w *proxyWorkflow) republishTimer(ctx workflow.Context) workflow.Future {
	if w.policy.legacy || w.republishAt.IsZero() {
		return nil
	}
	return w.timer(ctx, max(w.republishAt.Sub(workflow.Now(ctx)), 0),
		workflow.TimerOptions{Summary: "write the Proxy's status again"})
}

// Upper bounds on the history events each thing a run does costs, workflow tasks included:
// a signal, an activity completion and a timer firing may each need a workflow task
// (scheduled, started, completed); an activity has scheduled, started, closed and perhaps
// cancel-requested events; a timer started and fired or cancelled; a local activity a
// marker (and perhaps a task); an upsert one event. The recorder in the tests counts the
// same way and is checked against histories recorded on a real server.
const (
	costStart    = 5
	costSignal   = 4
	costActivity = 7
	costTimer    = 5
	costLocal    = 4
	costUpsert   = 1
)

// activity, local and timer start an activity, a local activity or a timer, counting the
// events they may cost.
func (w *proxyWorkflow) activity(ctx workflow.Context, act any, arg any) workflow.Future {
	w.cost += costActivity
	return workflow.ExecuteActivity(ctx, act, arg)
}

func (w *proxyWorkflow) local(ctx workflow.Context, act any, arg any) workflow.Future {
	w.cost += costLocal
	return workflow.ExecuteLocalActivity(ctx, act, arg)
}

func (w *proxyWorkflow) timer(ctx workflow.Context, d time.Duration, opts workflow.TimerOptions) workflow.Future {
	w.cost += costTimer
	return workflow.NewTimerWithOptions(ctx, d, opts)
}

// runEnd is when this run has lived long enough: it then continues as new.
func (w *proxyWorkflow) runEnd() time.Time { return w.runStart.Add(w.tuning.MaxRunAge) }

// overBudget reports whether this run has done enough and should continue as new, and why.
// The server's own counts (events, bytes, its suggestion) are checked with the run's signal
// count and age, so no mix or rate of signals brings a run near a server limit, and a
// stable proxy's run ends too. Runs of an older version keep the rule they started with.
func (w *proxyWorkflow) overBudget(ctx workflow.Context) (bool, string) {
	info := workflow.GetInfo(ctx)
	limit := w.tuning.HistoryLimit
	if w.policy.legacy {
		return info.GetContinueAsNewSuggested() || limit > 0 && info.GetCurrentHistoryLength() >= limit, "history"
	}
	if limit <= 0 {
		limit = DefaultHistoryLimit
	}
	switch {
	case info.GetContinueAsNewSuggested():
		return true, "server suggested"
	case info.GetCurrentHistoryLength() >= limit || w.cost >= limit:
		return true, "events"
	case info.GetCurrentHistorySize() >= w.tuning.MaxRunBytes:
		return true, "bytes"
	case w.signals >= w.tuning.MaxRunSignals:
		return true, "signals"
	case !workflow.Now(ctx).Before(w.runEnd()):
		return true, "age"
	}
	return false, ""
}

func (w *proxyWorkflow) continueAsNew(ctx workflow.Context, why string) error {
	w.drainSignals()
	if w.policy.shardWatched {
		// A signal left unread would be lost with this run: a verdict is carried over.
		for w.monCh.Len() > 0 {
			if r := w.receiveReport(w.monCh); r != nil {
				w.apply(w.state.monitorReturned(r.Result, workflow.Now(ctx)))
			}
		}
	}
	next := w.in
	next.State = w.state
	info := workflow.GetInfo(ctx)
	w.log.Info("continuing as new", "reason", why, "events", info.GetCurrentHistoryLength(),
		"bytes", info.GetCurrentHistorySize(), "signals", w.signals)
	return workflow.NewContinueAsNewError(ctx, ProxyWorkflow, next)
}

// equalData compares plain values (no funcs, channels or pointers to shared state). Deep
// equality of data is deterministic; workflowcheck flags reflect only because reflection
// can allocate.
//
//workflowcheck:ignore
func equalData(x, y any) bool { return reflect.DeepEqual(x, y) }
