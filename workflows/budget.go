package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"
)

// What a run costs in history, and when it has done enough and continues as new.

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
	w.budget.cost += costActivity
	return workflow.ExecuteActivity(ctx, act, arg)
}

func (w *proxyWorkflow) local(ctx workflow.Context, act any, arg any) workflow.Future {
	w.budget.cost += costLocal
	return workflow.ExecuteLocalActivity(ctx, act, arg)
}

func (w *proxyWorkflow) timer(ctx workflow.Context, d time.Duration, opts workflow.TimerOptions) workflow.Future {
	w.budget.cost += costTimer
	return workflow.NewTimerWithOptions(ctx, d, opts)
}

// runEnd is when this run has lived long enough: it then continues as new.
func (w *proxyWorkflow) runEnd() time.Time { return w.budget.start.Add(w.tuning.MaxRunAge) }

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
	case info.GetCurrentHistoryLength() >= limit || w.budget.cost >= limit:
		return true, "events"
	case info.GetCurrentHistorySize() >= w.tuning.MaxRunBytes:
		return true, "bytes"
	case w.budget.signals >= w.tuning.MaxRunSignals:
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
		for w.ch.monitor.Len() > 0 {
			if r := w.receiveReport(w.ch.monitor); r != nil {
				w.apply(w.state.monitorReturned(r.Result, workflow.Now(ctx)))
			}
		}
	}
	next := w.in
	next.State = w.state
	info := workflow.GetInfo(ctx)
	w.log.Info("continuing as new", "reason", why, "events", info.GetCurrentHistoryLength(),
		"bytes", info.GetCurrentHistorySize(), "signals", w.budget.signals)
	return workflow.NewContinueAsNewError(ctx, ProxyWorkflow, next)
}
