package monitor

import (
	"slices"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// thresholds decide when probe results become a recorded change.
type thresholds struct {
	success, failure int
	latency          time.Duration
}

// record folds one probe result into st and reports whether it is worth returning for.
// A verdict flips only after a full run of successes or failures; a latency change counts
// only while healthy, only when the median of the recent probes moves by more than
// max(20ms, 50%), and at most once per latency interval, so jitter never writes status.
func (th thresholds) record(st *Progress, res probe.Result, now time.Time) (string, bool) {
	h := &st.Health
	h.CheckedAt = now
	if res.OK {
		st.ConsecOK++
		st.ConsecFail = 0
	} else {
		st.ConsecFail++
		st.ConsecOK = 0
		h.LastFailure = res.Message
		h.FailureKind = res.Kind
	}
	latency := res.Latency.Milliseconds()
	if res.OK {
		st.Recent = append(st.Recent, latency)
		if len(st.Recent) > latencyWindow {
			st.Recent = st.Recent[len(st.Recent)-latencyWindow:]
		}
		latency = median(st.Recent)
	}
	switch {
	case (!h.Known || !h.Healthy) && st.ConsecOK >= th.success:
		h.Known, h.Healthy, h.Since, h.LatencyMillis = true, true, now, latency
		h.LastFailure, h.FailureKind, h.FailureReason = "", "", ""
		st.LastReport = now
		return ReasonVerdict, true
	case (!h.Known || h.Healthy) && st.ConsecFail >= th.failure:
		h.Known, h.Healthy, h.Since = true, false, now
		st.LastReport = now
		return ReasonVerdict, true
	case h.Known && h.Healthy && res.OK && now.Sub(st.LastReport) >= th.latency:
		delta := latency - h.LatencyMillis
		if delta < 0 {
			delta = -delta
		}
		if delta > max(20, h.LatencyMillis/2) {
			h.LatencyMillis = latency
			st.LastReport = now
			return ReasonLatency, true
		}
	}
	return "", false
}

// fold folds one probe result into st and reports whether it is worth returning for, and
// why. It is record, except for a failure against a health-check target judged down
// (target.Down, see targets.go) while the proxy did its part: that failure says nothing
// about the proxy, so it changes no verdict. A healthy proxy stays healthy (so it stays
// leasable and unhealthyReplaceAfter never starts), an unhealthy one stays unhealthy (its
// grace runs on: its own failure came first), and both carry
// ReasonHealthCheckTargetDown with a message naming the target, until the proxy passes
// successThreshold probes again or fails on its own.
//
// A change of that reason alone is reported (ReasonTarget) at most once per th.latency,
// like a latency change: it changes what the Proxy's status says, not what anyone does, and
// a flapping target would otherwise send a report per proxy per flip. Verdicts are never
// held back by it. credsReason is the reason a failure has when the credentials Secret may
// not be used.
func (th thresholds) fold(st *Progress, res probe.Result, target targetJudgement, credsReason string, now time.Time) (string, bool) {
	h := &st.Health
	var reason string
	var changed bool
	if !res.OK && res.TargetFailed && target.Down {
		// Neither a success nor a failure of the proxy: a run of successes starts again
		// (the proxy was not seen to work), a run of failures does not grow.
		h.CheckedAt = now
		st.ConsecOK = 0
		h.LastFailure, h.FailureKind, h.FailureReason = target.message(res), res.Kind, v1alpha1.ReasonHealthCheckTargetDown
	} else {
		rec := th
		if !res.OK && res.TargetFailed && h.Known && h.Healthy {
			// Not judged down (yet): see targetFailureMin.
			rec.failure = max(th.failure, targetFailureMin)
		}
		reason, changed = rec.record(st, res, now)
		switch {
		case res.OK:
			if h.FailureReason == v1alpha1.ReasonHealthCheckTargetDown && st.ConsecOK >= th.success {
				// The target answers through this proxy again. (A verdict that turned
				// healthy has cleared the reason already.)
				h.LastFailure, h.FailureKind, h.FailureReason = "", "", ""
			}
		case h.FailureReason == v1alpha1.ReasonHealthCheckTargetDown && h.Known && h.Healthy && !changed:
			// A failure of a healthy proxy that shows its target down, which is not
			// judged down now: record counted it towards the proxy's own verdict, and the
			// reason stays until that verdict flips or the proxy passes again.
		default:
			h.FailureReason = credsReason
		}
	}
	if changed {
		st.Reported = h.FailureReason
		return reason, true
	}
	if h.FailureReason != st.Reported {
		aboutTarget := h.FailureReason == v1alpha1.ReasonHealthCheckTargetDown || st.Reported == v1alpha1.ReasonHealthCheckTargetDown
		switch {
		case aboutTarget && now.Sub(st.ReasonAt) >= th.latency:
			reason, changed = ReasonTarget, true
			st.ReasonAt = now
		case !aboutTarget && h.Known && !h.Healthy:
			// A proxy already unhealthy whose failure now has another reason (its Secret,
			// missing until now, turned up without the label; or was labelled but lacks
			// its keys) says so: the condition must name what the user has to fix.
			reason, changed = ReasonVerdict, true
		}
		if changed {
			st.LastReport, st.Reported = now, h.FailureReason
		}
	}
	return reason, changed
}

// latencyWindow is how many recent probes the reported latency is the median of: a
// sustained change shows after 3 probes, up to 2 outliers change nothing.
const latencyWindow = 5

func median(v []int64) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
