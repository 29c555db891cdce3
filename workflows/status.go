package workflows

import (
	"fmt"
	"math"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// What the Proxy's status says, derived from the state alone: the phase, and the status
// subresource with its four conditions.

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
		if s.Next != nil || s.ReplaceReason != "" || s.Instance.Hash != DesiredHash(s.Spec, s.SecretHash) && !s.NeedHash && !s.heldForPool() || s.lacksCredentials(s.Instance) {
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

// status derives the Proxy's status subresource from the state: where the proxy is, and
// one function per condition, each its own rule. Condition times are left to the activity,
// which keeps a condition's transition time when its status is unchanged.
func status(s *ProxyState, workflowID string) v1alpha1.ProxyStatus {
	ph := phase(s)
	st := v1alpha1.ProxyStatus{
		Phase:              ph,
		Replacements:       s.Replacements,
		ObservedGeneration: s.Generation,
		WorkflowID:         workflowID,
	}
	if s.policy.poolGrants {
		// Older runs wrote the status without it: a status that differs is one more
		// write, a command their histories do not have.
		st.RetiringInstances = int32(min(len(s.Retiring), math.MaxInt32))
	}
	switch {
	case s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		st.IP, st.Port = s.Spec.Endpoint.Host, s.Spec.Endpoint.Port
	case s.Instance.Running():
		st.IP, st.Port = s.Instance.IP, s.Instance.Port
		st.InstanceName, st.ProviderID = s.Instance.Name, s.Instance.ProviderID
	}
	if s.Health.Known {
		st.LatencyMillis = s.Health.LatencyMillis
		if !s.Health.CheckedAt.IsZero() {
			st.LastHealthCheckTime = &metav1.Time{Time: s.Health.CheckedAt}
		}
	}
	provisioned := provisionedCondition(s, ph)
	healthy := healthyCondition(s.Health)
	st.Conditions = []metav1.Condition{provisioned, healthy, quotaCondition(s.Quota),
		readyCondition(ph, provisioned, healthy, s.Health, s.Deleting)}
	if s.gated() {
		st.Conditions = append(st.Conditions, replacementPendingCondition(s))
	}
	return st
}

// replacementPendingCondition is a pool member's: whether a replacement it wants on its
// own account waits for the pool's grant, and what asked for it. The pool reads it to
// grant within maxSurge; an operator reads it to see why a banned or aged proxy has not
// been replaced yet.
func replacementPendingCondition(s *ProxyState) metav1.Condition {
	if s.Asked == nil || s.Deleting {
		return metav1Condition(v1alpha1.ConditionReplacementPending, "False", v1alpha1.ReasonNoneWanted,
			"no replacement waits for the pool")
	}
	return metav1Condition(v1alpha1.ConditionReplacementPending, "True", s.Asked.Cause,
		fmt.Sprintf("%s: the replacement waits for pool %s to allow it within maxSurge", s.Asked.Reason, s.Pool))
}

// provisionedCondition says whether an instance (or an External endpoint) is there to
// serve, and if not, what stands in the way, most telling first: a latched failure, the
// cloud-init Secret, quota, a provider error, then the wait for an address. Deleting and
// replacing override it, since that is what the Proxy is doing.
func provisionedCondition(s *ProxyState, ph v1alpha1.Phase) metav1.Condition {
	c := metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonPending, "waiting for the first spec")
	switch {
	case s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeExternal:
		c = metav1Condition(v1alpha1.ConditionProvisioned, "True", v1alpha1.ReasonExternalEndpoint,
			fmt.Sprintf("external endpoint %s:%d", s.Spec.Endpoint.Host, s.Spec.Endpoint.Port))
	case s.Instance.Running():
		c = metav1Condition(v1alpha1.ConditionProvisioned, "True", v1alpha1.ReasonInstanceRunning,
			fmt.Sprintf("instance %s is running", s.Instance.Name))
	case s.Failure != nil && s.Failure.Generation == s.Generation:
		c = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonPermanentError, s.Failure.Message)
	case s.CloudInitError != "":
		c = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonCloudInitError, s.CloudInitError)
	case s.Quota != "":
		c = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonQuotaExceeded, s.Quota)
	case s.LastError != "":
		c = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonProviderError, s.LastError)
	case s.Instance != nil:
		c = metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonProvisioning,
			fmt.Sprintf("waiting for instance %s to be running", s.Instance.Name))
	}
	if s.Deleting {
		return metav1Condition(v1alpha1.ConditionProvisioned, "False", v1alpha1.ReasonDeleting, "deleting the instance")
	}
	if ph == v1alpha1.PhaseReplacing && s.Instance.Running() {
		c.Reason = v1alpha1.ReasonReplacing
		c.Message = "instance " + s.Instance.Name + " serves while its replacement is built"
		if s.Next != nil {
			c.Message += " (" + s.Next.Name + ")"
		}
	}
	return c
}

// healthyCondition is the verdict of the probes through the proxy. The monitor keeps the
// verdict while the health-check target is down for most of the fleet (its failures say
// nothing about this proxy) and says so in FailureReason.
func healthyCondition(h activities.Health) metav1.Condition {
	targetDown := h.FailureReason == v1alpha1.ReasonHealthCheckTargetDown
	switch {
	case !h.Known && targetDown:
		// No verdict yet, and none can come while the target is down.
		return metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, h.LastFailure)
	case !h.Known:
		return metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonNotProbed, "no verdict yet")
	case h.Healthy && targetDown:
		// Unknown: probes do not succeed now (True says they do), yet nothing says the
		// proxy failed (False would make a fleet with a dead target read as a fleet of
		// dead proxies). The verdict acted on stays healthy, so the phase stays Ready, the
		// proxy leasable, and Ready True.
		return metav1Condition(v1alpha1.ConditionHealthy, "Unknown", v1alpha1.ReasonHealthCheckTargetDown, h.LastFailure)
	case h.Healthy:
		return metav1Condition(v1alpha1.ConditionHealthy, "True", v1alpha1.ReasonProbeSucceeded,
			fmt.Sprintf("probes through the proxy succeed (%dms)", h.LatencyMillis))
	}
	// The failure kind leads, so "proxy_auth: ..." reads the same in kubectl and in the
	// worker's metrics (its kind label).
	msg := h.LastFailure
	if k := h.FailureKind; k != "" {
		msg = string(k) + ": " + msg
	}
	reason := v1alpha1.ReasonProbeFailed
	if r := h.FailureReason; r != "" {
		reason = r
	}
	if msg == "instance "+LostPreempted {
		reason, msg = v1alpha1.ReasonPreempted, "the provider took the instance back (preempted); a new one is being created"
	}
	return metav1Condition(v1alpha1.ConditionHealthy, "False", reason, msg)
}

// quotaCondition says whether the provider refused an instance for quota (the run retries
// it later, never fails for it).
func quotaCondition(quota string) metav1.Condition {
	if quota != "" {
		return metav1Condition(v1alpha1.ConditionQuotaExceeded, "True", v1alpha1.ReasonQuotaExceeded, quota)
	}
	return metav1Condition(v1alpha1.ConditionQuotaExceeded, "False", v1alpha1.ReasonQuotaAvailable, "")
}

// readyCondition says the proxy can be leased: provisioned and healthy, which a healthy
// verdict kept through its health-check target's outage still allows.
func readyCondition(ph v1alpha1.Phase, provisioned, healthy metav1.Condition, h activities.Health, deleting bool) metav1.Condition {
	heldHealthy := h.FailureReason == v1alpha1.ReasonHealthCheckTargetDown && h.Known && h.Healthy
	if provisioned.Status != "True" || (healthy.Status != "True" && !heldHealthy) || deleting {
		return metav1Condition(v1alpha1.ConditionReady, "False", v1alpha1.ReasonNotReady, "phase "+string(ph))
	}
	c := metav1Condition(v1alpha1.ConditionReady, "True", v1alpha1.ReasonReady, "provisioned and healthy")
	if heldHealthy {
		c.Message = "provisioned, and healthy when its health-check target last answered"
	}
	return c
}

func metav1Condition(typ, status, reason, message string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: message}
}
