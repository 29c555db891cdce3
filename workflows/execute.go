package workflows

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The steps plan() chooses, carried out: each runs its activity, waits for it while
// taking signals, and hands the result to the core.

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
		switch {
		case s.Spec.GCP != nil:
			in.Project = s.Spec.GCP.Project
		case s.Spec.AWS != nil:
			in.Project = s.Spec.AWS.Region // the provider's "project" is its region
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
	_, err := w.await(ctx, w.activity(actx, a.CreateInstance, w.view().instanceInput(ref)), func() {}, false, &res)
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
	interrupted, err := w.await(ctx, w.activity(actx, a.WaitRunning, w.view().instanceInput(ref)), cancel, true, &res)
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
	_, err := w.await(ctx, w.activity(actx, a.DeleteInstance, w.view().instanceInput(&ref)), func() {}, false, nil)
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

func monitorHeartbeatTimeout(in activities.MonitorInput) time.Duration {
	interval, _ := in.HealthCheck.EffectiveInterval()
	timeout, _ := in.HealthCheck.EffectiveTimeout()
	return 2*interval + timeout + 10*time.Second
}

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
