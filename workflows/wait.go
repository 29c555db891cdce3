package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
)

// How the run waits. Every wait is a loop over waiter.next, the run's one selector: it
// takes signals (handing each to the core) and ends on the first of the wait's own
// events. The three loops below differ only in what ends them: an idle or backoff wait
// (waitSignals), a step's activity (await), and steady's wake, monitor or reports. The
// timers they keep — steady's wake, the status rewrite, await's throttled publish — are
// started by the waiter too, so what a run's waiting costs is in one place.

// waiter is what one wait selects on besides signals; a nil future is not waited for.
// The order of next's cases is the order every wait added them in before they shared
// this type: when several are ready at once, a replay must pick the same.
type waiter struct {
	// activity is the step's activity: the wait ends when it completes.
	activity workflow.Future
	// monitor is the Monitor activity of a run not watched by shards.
	monitor workflow.Future
	// reports reads shard reports here (runs of version 4, while steady only; later runs
	// take them with the signals).
	reports bool
	// deadline is a backoff or steady's wake.
	deadline workflow.Future
	// republish is the timer of a status write the API server refused.
	republish workflow.Future
	// publish is await's timer of a memo write held back (cooldowns).
	publish workflow.Future
}

// waited is what ended one next: the signals it took are in the run's flags.
type waited struct {
	activity, monitor, deadline, republish, publish bool
	// report is a shard report read by this wait (nil: none, or stale).
	report *activities.MonitorReport
}

// next blocks until a signal arrives (and is applied) or one of wt's futures is ready.
func (w *proxyWorkflow) next(ctx workflow.Context, wt *waiter) waited {
	var ev waited
	sel := workflow.NewSelector(ctx)
	if wt.activity != nil {
		sel.AddFuture(wt.activity, func(workflow.Future) { ev.activity = true })
	}
	w.addSignals(sel)
	if wt.monitor != nil {
		sel.AddFuture(wt.monitor, func(workflow.Future) { ev.monitor = true })
	}
	if wt.reports {
		sel.AddReceive(w.ch.monitor, func(c workflow.ReceiveChannel, _ bool) { ev.report = w.receiveReport(c) })
	}
	if wt.deadline != nil {
		sel.AddFuture(wt.deadline, func(workflow.Future) { ev.deadline = true })
	}
	if wt.republish != nil {
		sel.AddFuture(wt.republish, func(workflow.Future) { ev.republish = true })
	}
	if wt.publish != nil {
		sel.AddFuture(wt.publish, func(workflow.Future) { ev.publish = true })
	}
	sel.Select(ctx)
	return ev
}

// waitSignals blocks until a signal changes the plan or until (if set) passes. Reports are
// published as they come, and a run over its budget returns to continue as new.
func (w *proxyWorkflow) waitSignals(ctx workflow.Context, until time.Time) error {
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	var wt waiter
	if !until.IsZero() {
		wt.deadline = w.timer(tctx, until.Sub(workflow.Now(ctx)), workflow.TimerOptions{Summary: "back off before retrying"})
	}
	wt.republish = w.republishTimer(tctx)
	for passed := false; !w.flags.interrupt && !passed; {
		ev := w.next(ctx, &wt)
		passed = ev.deadline
		if w.policy.legacy {
			continue
		}
		if ev.republish {
			if err := w.publishState(ctx); err != nil {
				return err
			}
			wt.republish = w.republishTimer(tctx)
		}
		if w.flags.memoDirty {
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
	wt := waiter{activity: fut}
	for {
		ev := w.next(ctx, &wt)
		if ev.publish {
			wt.publish = nil
		}
		if ev.activity {
			return false, fut.Get(ctx, result)
		}
		over := false
		if w.policy.bounded() {
			over, _ = w.overBudget(ctx)
		}
		if w.policy.serveWhileReplacing && w.flags.memoDirty && !over {
			// A verdict while a step runs (a delete can take 15 minutes a try) reaches
			// discovery now, not when the step ends; cooldowns follow within
			// awaitPublishEvery, so crawlers' reports cannot make one write each. A run
			// over its budget writes nothing more until the step ends and it continues.
			next := w.written.at.Add(awaitPublishEvery)
			switch {
			case w.flags.urgent || ev.publish || !workflow.Now(ctx).Before(next):
				if err := w.publishState(ctx); err != nil {
					return false, err
				}
			case wt.publish == nil:
				wt.publish = w.timer(pctx, next.Sub(workflow.Now(ctx)), workflow.TimerOptions{Summary: "publish what crawlers reported"})
			}
		}
		if !interruptible {
			continue
		}
		if w.flags.interrupt || over {
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

// steady watches the proxy until something needs the workflow: a signal that changes the
// plan, a verdict or drift from the monitor, or a time the core asked to wake at.
func (w *proxyWorkflow) steady(ctx workflow.Context) error {
	s := w.state
	wake, wakeReason := s.nextWake(workflow.Now(ctx))
	if end := w.runEnd(); w.policy.bounded() && (wake.IsZero() || end.Before(wake)) {
		wake, wakeReason = end, wakeRunAge
	}

	mctx, cancelMonitor := workflow.WithCancel(ctx)
	defer cancelMonitor()
	var monitor workflow.Future
	sharded := w.policy.shardWatched
	if in, ok := w.view().monitorInput(); ok && !sharded {
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
	wt := waiter{monitor: monitor, reports: sharded && !w.policy.serveWhileReplacing}
	if sharded {
		wt.deadline = w.wakeTimer(ctx, wake, wakeReason)
	} else if !wake.IsZero() {
		wt.deadline = w.timer(tctx, max(wake.Sub(workflow.Now(ctx)), 0), workflow.TimerOptions{Summary: wakeReason})
	}
	w.details(ctx, w.steadyReason(wake, wakeReason))
	wt.republish = w.republishTimer(tctx)
	// A report applied before this wait is already in the state it planned from.
	w.flags.reported = false

	for {
		ev := w.next(ctx, &wt)
		switch {
		case w.flags.interrupt:
			return nil
		case ev.republish:
			if err := w.publishState(ctx); err != nil {
				return err
			}
			wt.republish = w.republishTimer(tctx)
		case w.flags.memoDirty && !ev.monitor && !ev.deadline && ev.report == nil && !w.flags.reported:
			// A report: publish the cooldowns and keep watching.
			if err := w.publishState(ctx); err != nil {
				return err
			}
		case ev.deadline:
			w.wake = pendingWake{}
			s.woke(wakeReason, workflow.Now(ctx))
			return nil
		case ev.monitor:
			var res activities.MonitorResult
			if err := monitor.Get(ctx, &res); err != nil {
				// Only a bug or a config the schema should have refused ends up here.
				w.log.Error("monitor failed", "error", err)
				s.monitorFailed(errorMessage(err))
				return w.sleep(ctx, w.tuning.Backoff(1))
			}
			w.apply(s.monitorReturned(res, workflow.Now(ctx)))
			return nil
		case ev.report != nil:
			w.apply(s.monitorReturned(ev.report.Result, workflow.Now(ctx)))
			return nil
		case w.flags.reported:
			// addSignals applied a report: replan with it, as above.
			w.flags.reported = false
			return nil
		}
		if w.policy.bounded() {
			if over, _ := w.overBudget(ctx); over {
				return nil
			}
		}
	}
}

// pendingWake is a timer steady started, and what for.
type pendingWake struct {
	at     time.Time
	reason string
	timer  workflow.Future
	cancel workflow.CancelFunc
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

func (w *proxyWorkflow) sleep(ctx workflow.Context, d time.Duration) error {
	return w.waitSignals(ctx, workflow.Now(ctx).Add(d))
}

// republishTimer starts the timer of the next status write, if one is pending, or returns
// nil. The steady and idle waits select on it, so a status that could not be written (the
// API server was down) is written once it is back, without waiting for the next change.
func (w *proxyWorkflow) republishTimer(ctx workflow.Context) workflow.Future {
	if w.policy.legacy || w.written.retryAt.IsZero() {
		return nil
	}
	return w.timer(ctx, max(w.written.retryAt.Sub(workflow.Now(ctx)), 0),
		workflow.TimerOptions{Summary: "write the Proxy's status again"})
}
