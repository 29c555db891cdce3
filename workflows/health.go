package workflows

import (
	"fmt"
	"time"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The monitor's verdicts, and the times a steady run wakes at (maxAge, the unhealthy
// grace): transitions of the pure core, like those in transitions.go.

// LostPreempted is why an instance was lost when the cloud took it back (a GCP Spot VM):
// the status's Healthy condition then has reason Preempted.
const LostPreempted = "preempted"

// monitorReturned records a change the monitor found: a verdict, a latency, or an instance
// lost behind our back (which is retired and recreated, showing Unhealthy meanwhile).
func (s *ProxyState) monitorReturned(res activities.MonitorResult, now time.Time) effect {
	prev := s.Health
	s.Health = res.Health
	var healed effect
	if s.Asked != nil && s.Asked.Cause == v1alpha1.ReasonUnhealthyGrace && res.Health.Known && res.Health.Healthy {
		// What asked is over: a healthy proxy is not worth a surge instance.
		s.Asked = nil
		healed = effect{note: "healthy again: the replacement that waited for the pool is no longer wanted"}
	}
	if res.Reason == activities.MonitorVerdict && (prev.Known != res.Health.Known || prev.Healthy != res.Health.Healthy) {
		// Grace periods count in workflow time, which replays exactly.
		s.Health.Since = now
	} else {
		s.Health.Since = prev.Since
	}
	switch res.Reason {
	case activities.MonitorCredentials:
		// The memo carries the new sealed credentials to discovery at the next publish.
		s.Sealed = res.Sealed
		if s.Sealed == "" {
			return effect{publish: true, note: "the credentials Secret may not be used; the proxy is not leased until it may"}
		}
		return effect{publish: true, note: "the credentials Secret changed; leases now hand out the new credentials"}
	case activities.MonitorGone, activities.MonitorStopped:
		if s.Instance != nil {
			name, why := s.Instance.Name, res.Reason
			if res.Instance.Preempted {
				why = LostPreempted
			}
			s.Instance.Lost, s.Instance.LostReason = true, why
			s.retire(name)
			// Whatever a replacement was wanted for, the instance it concerned is gone.
			s.Asked = nil
			if s.policy.poolGrants {
				// So are the bans and rests its address earned: the next instance has an
				// address of its own, and must not ask the pool on its first ban for what
				// the lost one was banned for. (Older runs' histories kept them.)
				s.Cooldowns, s.Bans = nil, nil
			}
			s.Health = activities.Health{Known: true, Healthy: false, Since: now, LastFailure: "instance " + why}
			if s.policy.serveWhileReplacing && s.Next != nil {
				// Its replacement is already being built: it takes over (a report can now
				// arrive while it is), and whatever it was built for is done. It is watched
				// like any current instance once it runs.
				s.Instance, s.Next = s.Next, nil
				if h := s.Instance.Health; h != nil {
					// Already checked through itself: that verdict is the proxy's now.
					s.Health = *h
					s.Health.Since = now
				}
				s.Instance.CreatedAt, s.Instance.Health = now, nil
				s.ReplaceReason, s.Cooldowns, s.Bans = "", nil, nil
				s.Replacements++
				return effect{publish: true, note: "instance lost; its replacement " + s.Instance.Name + " takes over: " + name + " (" + why + ")", warn: true}
			}
			return effect{note: "instance lost; recreating: " + name + " (" + why + ")", warn: true}
		}
	}
	return healed
}

// monitorFailed records a monitor that could not run (a bug or a config the schema should
// have refused).
func (s *ProxyState) monitorFailed(msg string) {
	s.Health.LastFailure, s.Health.FailureReason = msg, ""
}

// Reasons the steady step wakes up by itself.
const (
	wakeRetry       = "retry"
	wakeRetryDelete = "retry-delete"
	wakeMaxAge      = "maxAge"
	wakeUnhealthy   = "unhealthy"
	// wakeRunAge ends the run so it continues as new (the loop adds it; see runEnd).
	wakeRunAge = "run-age"
)

// nextWake is when the steady step, starting at now, must wake without a signal or a
// monitor result, and why: a retry time, the instance's maxAge, or the end of the
// unhealthy grace. Zero means never.
func (s *ProxyState) nextWake(now time.Time) (time.Time, string) {
	var wake time.Time
	var why string
	set := func(t time.Time, reason string) {
		if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
			wake, why = t, reason
		}
	}
	if !s.policy.poolGrants || s.RetryAt.After(now) {
		// A retry time already past when the run waits is spent: plan would have taken
		// the step it held back (a step that succeeded on its retry leaves it; a pool
		// member then waits for a grant). Waking for it would wake at once, and again,
		// without the run ever yielding. (Older runs' histories woke for it.)
		set(s.RetryAt, wakeRetry)
	}
	set(s.DeleteRetryAt, wakeRetryDelete)
	if s.Instance.Running() && s.ReplaceReason == "" && s.Asked == nil {
		// Once a replacement is asked for (or waits for its pool), neither is news: a wake
		// for a time already past (a replacement held while a delete waits for its retry)
		// would fire at once, again and again, without the run ever yielding.
		if age := s.maxAge(); age > 0 {
			set(s.Instance.CreatedAt.Add(age), wakeMaxAge)
		}
		if grace := s.unhealthyGrace(); grace > 0 && s.Health.Known && !s.Health.Healthy {
			set(s.Health.Since.Add(grace), wakeUnhealthy)
		}
	}
	return wake, why
}

// woke records that the steady step's timer fired: maxAge and a lasting unhealthy verdict
// call for a replacement.
func (s *ProxyState) woke(why string, now time.Time) {
	if s.ReplaceReason != "" || s.Asked != nil {
		return
	}
	switch why {
	case wakeMaxAge:
		s.askReplace(v1alpha1.ReasonMaxAge, "maxAge", now)
	case wakeUnhealthy:
		s.askReplace(v1alpha1.ReasonUnhealthyGrace, fmt.Sprintf("unhealthy for %s", s.unhealthyGrace()), now)
	}
}

// askReplace starts a replacement the run wants on its own account (maxAge, the unhealthy
// grace, bans), and reports whether it started. A pool member's waits for its pool's
// grant instead (Asked, shown as condition ReplacementPending): the pool lets at most
// maxSurge of its Proxies replace at once whatever asks, so a site that bans the whole
// pool, or a batch that comes due together, does not rebuild it all at the same moment.
func (s *ProxyState) askReplace(cause, reason string, now time.Time) bool {
	if s.gated() {
		if s.Asked == nil {
			s.Asked = &AskedReplace{Cause: cause, Reason: reason, Since: now}
		}
		return false
	}
	s.ReplaceReason = reason
	return true
}

// gated says the run's own replacements wait for its pool's grant.
func (s *ProxyState) gated() bool { return s.policy.poolGrants && s.Pool != "" }

// rotated says the serving instance differs from the one wanted now by its cloud-init
// Secret's data alone: the spec it was built from shapes the same instance as today's.
func (s *ProxyState) rotated() bool {
	cur := s.Instance
	if !cur.Running() || s.NeedHash || s.Spec == nil || s.Spec.CloudInit == nil {
		return false
	}
	desired := DesiredHash(s.Spec, s.SecretHash)
	return cur.Hash != desired && DesiredHash(&cur.Spec, s.SecretHash) == desired
}

// heldForPool says a pool member's instance is due only for a rotation of its cloud-init
// Secret, and waits for its pool's grant to be replaced: the Secret changes for every
// member at once, and the pool rolls it out within maxSurge, as a template change.
func (s *ProxyState) heldForPool() bool {
	return s.gated() && s.ReplaceReason == "" && s.Next == nil && !s.lacksCredentials(s.Instance) && s.rotated()
}

// askRotation keeps a pool member's ask for a rotation in step with its instance: asked
// while heldForPool, withdrawn once the instance no longer differs by the Secret alone (it
// was rotated back, or a replacement is under way for another reason).
func (s *ProxyState) askRotation(now time.Time) {
	if !s.gated() {
		return
	}
	switch held := s.heldForPool(); {
	case held && s.Asked == nil:
		s.Asked = &AskedReplace{Cause: v1alpha1.ReasonCloudInit, Reason: "the cloud-init Secret changed", Since: now}
	case !held && !s.NeedHash && s.Asked != nil && s.Asked.Cause == v1alpha1.ReasonCloudInit:
		// (While the Secret is read again the ask stands: most writes to it are not
		// rotations back, and the ask keeps its place in the pool's queue.)
		s.Asked = nil
	}
}
