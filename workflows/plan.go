package workflows

import (
	"time"

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
	if s.heldForPool() {
		// A rotation of the cloud-init Secret, which waits for the pool's grant (Asked).
		return stepSteady
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
