package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
)

// How the run waits: for signals, for an activity, and while steady, with the timers
// each wait keeps (a wake, a status rewrite, a publish of what crawlers reported).

// pendingWake is a timer steady started, and what for.
type pendingWake struct {
	at     time.Time
	reason string
	timer  workflow.Future
	cancel workflow.CancelFunc
}

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
	for !w.flags.interrupt && !timerDone {
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
		if w.policy.serveWhileReplacing && w.flags.memoDirty && !over {
			// A verdict while a step runs (a delete can take 15 minutes a try) reaches
			// discovery now, not when the step ends; cooldowns follow within
			// awaitPublishEvery, so crawlers' reports cannot make one write each. A run
			// over its budget writes nothing more until the step ends and it continues.
			next := w.written.at.Add(awaitPublishEvery)
			switch {
			case w.flags.urgent || publishDue || !workflow.Now(ctx).Before(next):
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
	wake, wakeReason := s.nextWake()
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
	var timer workflow.Future
	if sharded {
		timer = w.wakeTimer(ctx, wake, wakeReason)
	} else if !wake.IsZero() {
		timer = w.timer(tctx, max(wake.Sub(workflow.Now(ctx)), 0), workflow.TimerOptions{Summary: wakeReason})
	}
	w.details(ctx, w.steadyReason(wake, wakeReason))
	republish := w.republishTimer(tctx)
	// A report applied before this wait is already in the state it planned from.
	w.flags.reported = false

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
			sel.AddReceive(w.ch.monitor, func(c workflow.ReceiveChannel, _ bool) { report = w.receiveReport(c) })
		}
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timerDone = true })
		}
		if republish != nil {
			sel.AddFuture(republish, func(workflow.Future) { republishDue = true })
		}
		sel.Select(ctx)
		switch {
		case w.flags.interrupt:
			return nil
		case republishDue:
			if err := w.publishState(ctx); err != nil {
				return err
			}
			republish = w.republishTimer(tctx)
		case w.flags.memoDirty && !monitorDone && !timerDone && report == nil && !w.flags.reported:
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
