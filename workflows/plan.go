package workflows

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// step is the next thing ProxyWorkflow does. plan chooses it from the state alone, so every
// decision is a table test away from being checked, without Temporal or a provider.
type step int

const (
	// stepIdle waits for a signal: there is no spec yet, or a permanent failure is latched.
	stepIdle step = iota
	// stepFinish ends the workflow: deletion is done.
	stepFinish
	// stepDelete deletes Retiring[0] and waits until it is gone.
	stepDelete
	// stepHash (re)computes the cloud-init Secret's hash.
	stepHash
	// stepCreate creates the current instance (none yet, or its creation did not finish).
	stepCreate
	// stepRetireCurrent drops a current instance that is not serving and no longer matches
	// the spec; nothing is lost by deleting it first.
	stepRetireCurrent
	// stepWaitRunning waits for the current instance to get an address.
	stepWaitRunning
	// stepCreateNext creates the replacement while the current instance keeps serving.
	stepCreateNext
	// stepRetireNext drops a replacement that no longer matches the spec or is not needed.
	stepRetireNext
	// stepWaitNext waits for the replacement to get an address.
	stepWaitNext
	// stepVerifyNext probes the running replacement before traffic moves to it.
	stepVerifyNext
	// stepPromote makes the verified replacement current and retires the old instance.
	stepPromote
	// stepSteady monitors the proxy and waits for signals, timers or a retry time.
	stepSteady
	// stepList finds the instances earlier runs left, on a run that started without state.
	stepList
)

var stepNames = map[step]string{
	stepIdle: "idle", stepFinish: "finish", stepDelete: "delete", stepHash: "hash",
	stepCreate: "create", stepRetireCurrent: "retire-current", stepWaitRunning: "wait-running",
	stepCreateNext: "create-next", stepRetireNext: "retire-next", stepWaitNext: "wait-next",
	stepVerifyNext: "verify-next", stepPromote: "promote", stepSteady: "steady", stepList: "list",
}

func (s step) String() string { return stepNames[s] }

// plan returns the next step for state s at time now.
func plan(s *ProxyState, now time.Time) step {
	// Deletes come first: an instance we no longer want costs money and may carry traffic
	// the spec no longer allows. Except after a loss: a lost instance carries nothing, and
	// a Proxy without an instance serves nobody until the next one boots, so that one is
	// created first (its deletion follows at once, while the new one boots).
	if len(s.Retiring) > 0 && s.policy.createFirst && s.Instance == nil && allLost(s.Retiring) {
		if st := planLive(s, now); st == stepCreate || st == stepHash {
			return st
		}
	}
	if len(s.Retiring) > 0 {
		if now.Before(s.DeleteRetryAt) {
			if s.policy.serveWhileReplacing {
				// A delete failed and waits for its retry: what keeps the Proxy served
				// goes on meanwhile, so an instance that refuses to go (deletion
				// protection, a stuck finalizer) does not leave the Proxy without one.
				// Replacements wait: each would add an instance that cannot be deleted
				// either, one per maxAge for as long as deletes fail. Nor is finishing
				// (it needs the deletes done) or an idle wait (it would not wake for the
				// retry) chosen.
				switch st := planLive(s, now); st {
				case stepList, stepHash, stepCreate, stepRetireCurrent, stepWaitRunning:
					return st
				}
			}
			return stepSteady
		}
		return stepDelete
	}
	return planLive(s, now)
}

// allLost reports whether every retiring instance was lost behind the workflow's back.
func allLost(refs []InstanceRef) bool {
	for _, r := range refs {
		if !r.Lost {
			return false
		}
	}
	return true
}

// planLive is plan once nothing is left to delete: the live instances' next step.
func planLive(s *ProxyState, now time.Time) step {
	if s.Unlisted && s.UID != "" {
		// Before creating anything, and before a deletion can finish: what earlier runs
		// left must be known, or it would leak.
		if now.Before(s.RetryAt) {
			return stepSteady
		}
		return stepList
	}
	if s.Deleting {
		return stepFinish
	}
	if s.Spec == nil {
		return stepIdle
	}
	if s.Spec.EffectiveMode() == v1alpha1.ModeExternal {
		return stepSteady
	}
	if s.Failure != nil && s.Failure.Generation == s.Generation {
		return stepIdle
	}
	if now.Before(s.RetryAt) {
		return stepSteady
	}
	if s.NeedHash {
		return stepHash
	}
	desired := DesiredHash(s.Spec, s.SecretHash)
	cur := s.Instance
	if cur != nil && cur.Hash != desired && !cur.Running() {
		return stepRetireCurrent
	}
	if cur == nil || !cur.Created {
		return stepCreate
	}
	if !cur.Running() {
		return stepWaitRunning
	}
	if cur.Hash != desired || s.ReplaceReason != "" || s.lacksCredentials(cur) {
		next := s.Next
		switch {
		case next != nil && next.Hash != desired:
			return stepRetireNext
		case next == nil || !next.Created:
			return stepCreateNext
		case !next.Running():
			return stepWaitNext
		case next.Health == nil:
			return stepVerifyNext
		default:
			return stepPromote
		}
	}
	if s.Next != nil {
		// The replacement is no longer needed (e.g. the spec was edited back).
		return stepRetireNext
	}
	return stepSteady
}

// phase derives the Proxy's phase from the state.
func phase(s *ProxyState) v1alpha1.Phase {
	switch {
	case s.Deleting:
		return v1alpha1.PhaseDeleting
	case s.Spec == nil:
		return v1alpha1.PhasePending
	case s.Failure != nil && s.Failure.Generation == s.Generation:
		return v1alpha1.PhaseFailed
	}
	external := s.Spec.EffectiveMode() == v1alpha1.ModeExternal
	if !external {
		if !s.Instance.Running() {
			switch {
			case s.Counter == 0 && s.Quota == "" && s.CloudInitError == "" && s.LastError == "":
				return v1alpha1.PhasePending
			case s.Health.Known && !s.Health.Healthy:
				// The instance died and is being recreated: to a crawler that is unhealthy.
				return v1alpha1.PhaseUnhealthy
			}
			return v1alpha1.PhaseProvisioning
		}
		if s.Next != nil || s.ReplaceReason != "" || s.Instance.Hash != DesiredHash(s.Spec, s.SecretHash) && !s.NeedHash || s.lacksCredentials(s.Instance) {
			return v1alpha1.PhaseReplacing
		}
	}
	switch {
	case !s.Health.Known:
		return v1alpha1.PhaseProvisioning
	case s.Health.Healthy:
		return v1alpha1.PhaseReady
	default:
		return v1alpha1.PhaseUnhealthy
	}
}

// status derives the Proxy's status subresource from the state. Condition times are left
// to the activity, which keeps a condition's transition time when its status is unchanged.
func status(s *ProxyState, workflowID string) v1alpha1.ProxyStatus {
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
	// The monitor keeps the verdict while the health-check target is down for most of the
	// fleet (its failures say nothing about this proxy) and says so in FailureReason.
	targetDown := s.Health.FailureReason == v1alpha1.ReasonHealthCheckTargetDown
	if s.Health.Known {
		st.LatencyMillis = s.Health.LatencyMillis
		if !s.Health.CheckedAt.IsZero() {
			st.LastHealthCheckTime = &metav1.Time{Time: s.Health.CheckedAt}
		}
		switch {
		case s.Health.Healthy && targetDown:
			// Unknown: probes do not succeed now (True says they do), yet nothing says the
			// proxy failed (False would make a fleet with a dead target read as a fleet of
			// dead proxies). The verdict acted on stays healthy, so the phase stays Ready,
			// the proxy leasable, and Ready True below.
			healthy = metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, s.Health.LastFailure)
		case s.Health.Healthy:
			healthy = metav1Condition(v1alpha1.ConditionHealthy, "True", v1alpha1.ReasonProbeSucceeded,
				fmt.Sprintf("probes through the proxy succeed (%dms)", s.Health.LatencyMillis))
		default:
			// The failure kind leads, so "proxy_auth: ..." reads the same in kubectl and in
			// the worker's metrics (its kind label).
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
		// No verdict yet, and none can come while the target is down.
		healthy = metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, s.Health.LastFailure)
	}

	quota := metav1Condition(v1alpha1.ConditionQuotaExceeded, "False", v1alpha1.ReasonQuotaAvailable, "")
	if s.Quota != "" {
		quota = metav1Condition(v1alpha1.ConditionQuotaExceeded, "True", v1alpha1.ReasonQuotaExceeded, s.Quota)
	}

	ready := metav1Condition(v1alpha1.ConditionReady, "False", v1alpha1.ReasonNotReady, "phase "+string(ph))
	// Ready says the proxy can be leased, which a healthy verdict kept through a target's
	// outage still allows.
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

func metav1Condition(typ, status, reason, message string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: message}
}
