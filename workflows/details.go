package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"
)

// What the run says in words, for people reading the Web UI: why it waits.

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
	if s.Asked != nil {
		text += "; replacement wanted (" + s.Asked.Reason + "), waiting for pool " + s.Pool + " to allow it within maxSurge"
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
