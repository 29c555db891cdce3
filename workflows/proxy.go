package workflows

import (
	"reflect"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
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
		ch: signalChannels{
			spec:    workflow.GetSignalChannel(ctx, contract.SignalSpec),
			del:     workflow.GetSignalChannel(ctx, contract.SignalDelete),
			repl:    workflow.GetSignalChannel(ctx, contract.SignalReplace),
			report:  workflow.GetSignalChannel(ctx, contract.SignalReport),
			monitor: workflow.GetSignalChannel(ctx, contract.SignalMonitor),
		},
		now:   func() time.Time { return workflow.Now(ctx) },
		state: in.State,
		wfID:  workflow.GetInfo(ctx).WorkflowExecution.ID,
	}
	if w.state == nil {
		w.state = &ProxyState{}
	}
	w.policy = policyFor(workflow.GetVersion(ctx, versionChangeID, workflow.DefaultVersion, versionLatest))
	w.budget.cost = costStart
	w.budget.start = workflow.Now(ctx)
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
	wfID   string
	tuning Tuning
	policy runPolicy
	log    log.Logger
	now    func() time.Time
	state  *ProxyState
	ch     signalChannels
	// flags are what signals and reports left for the loop to do.
	flags loopFlags
	// written is what the run last wrote where others read it.
	written written
	budget  runBudget
	// wake is steady's pending timer. A run watched by shards keeps it across the reports
	// that end one steady wait and start the next: a verdict or a latency that leaves the
	// wake time as it was would otherwise cancel the timer and start the same one again,
	// two events and a billable action each time.
	wake pendingWake
}

// signalChannels are the run's signal channels, one per signal.
type signalChannels struct {
	spec, del, repl, report workflow.ReceiveChannel
	// monitor carries a monitor shard's reports (MonitorReport). Runs of version 4 read it
	// only while steady (where the old Monitor activity's results were applied); later
	// ones in every wait (addSignals), since a step can last minutes (a delete tries for
	// up to 15) and a verdict must not wait for it.
	monitor workflow.ReceiveChannel
}

// loopFlags are what the signals and reports taken so far ask of the loop.
type loopFlags struct {
	// interrupt is set by a signal that changes what plan() would choose.
	interrupt bool
	// reported is set when a report was applied by addSignals: steady then returns to
	// replan, as it did when it read reports itself. watchLeft is set when a report moved
	// the run off the watch it published (see reportStale), until the next publish.
	reported  bool
	watchLeft bool
	// urgent is set when what discovery acts on changed (a verdict, an instance): await
	// publishes it at once; other memo changes (cooldowns) at most every
	// awaitPublishEvery.
	urgent bool
	// memoDirty is set by a report: cooldowns changed and discovery must see them.
	memoDirty bool
}

// runBudget is what this run has spent: it decides, with the server's counts, when the run
// has done enough (overBudget).
type runBudget struct {
	// start is when the run started; signals counts the signals it received.
	start   time.Time
	signals int
	// cost is an upper bound on the history events this run has written, counted from
	// what it did (see the cost constants). It bounds a run where the server's count is not
	// available, and is the budget the tests can check.
	cost int
}

func (w *proxyWorkflow) run(ctx workflow.Context) error {
	s := w.state
	for {
		w.drainSignals()
		s.askRotation(workflow.Now(ctx))
		if err := w.publishState(ctx); err != nil {
			return err
		}
		if over, why := w.overBudget(ctx); over {
			return w.continueAsNew(ctx, why)
		}
		w.flags.interrupt = false
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

// equalData compares plain values (no funcs, channels or pointers to shared state). Deep
// equality of data is deterministic; workflowcheck flags reflect only because reflection
// can allocate.
//
//workflowcheck:ignore
func equalData(x, y any) bool { return reflect.DeepEqual(x, y) }
