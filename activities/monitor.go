package activities

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Health is a recorded verdict about a proxy. The workflow keeps the last one and hands it
// to the next Monitor, so a restart continues from it instead of starting from "unknown".
type Health struct {
	// Known is false until the first verdict.
	Known         bool      `json:"known"`
	Healthy       bool      `json:"healthy"`
	LatencyMillis int64     `json:"latencyMillis,omitempty"`
	CheckedAt     time.Time `json:"checkedAt,omitempty"`
	// Since is when the current verdict began.
	Since       time.Time  `json:"since,omitempty"`
	LastFailure string     `json:"lastFailure,omitempty"`
	FailureKind probe.Kind `json:"failureKind,omitempty"`
	// FailureReason is the Healthy condition's reason for LastFailure when ProbeFailed
	// would not say it (a v1alpha1.Reason* constant): the probe was not sent because the
	// credentials Secret may not be used; or the health-check target is judged down
	// (ReasonHealthCheckTargetDown), and the verdict, healthy or not, is the one held before.
	FailureReason string `json:"failureReason,omitempty"`
}

// Why a Monitor returned.
const (
	MonitorVerdict = "verdict" // the verdict flipped (or became known)
	MonitorLatency = "latency" // latency moved enough to be worth recording
	MonitorGone    = "gone"    // the instance no longer exists
	MonitorStopped = "stopped" // the instance exists but will not serve again
	// MonitorCredentials: an External proxy's credentials Secret changed; Sealed holds
	// the new ones, sealed, for the workflow to publish.
	MonitorCredentials = "credentials"
	// MonitorTarget: the verdict stands, but whether its health-check target is judged
	// down changed (Health.FailureReason is, or no longer is,
	// v1alpha1.ReasonHealthCheckTargetDown). Sent at most once per LatencyEvery per proxy,
	// so a flapping target costs a bounded number of signals.
	MonitorTarget = "target"
)

// MonitorInput configures one Monitor run.
type MonitorInput struct {
	// Target is the proxy's host:port.
	Target      string               `json:"target"`
	HealthCheck v1alpha1.HealthCheck `json:"healthCheck"`
	// Last is the recorded verdict the monitor starts from.
	Last Health `json:"last"`
	// Instance is checked for drift every DriftInterval; nil for External proxies.
	Instance      *InstanceInput `json:"instance,omitempty"`
	DriftInterval time.Duration  `json:"driftInterval,omitempty"`
	// LatencyEvery rate-limits latency-only reports (default 10m). Latency only ranks
	// proxies in discovery, and a busy machine moves every proxy's latency at once: reported
	// every minute, a fleet of 1,000 under load wrote ~17 statuses and workflow tasks a
	// second, which delayed the health verdicts that matter.
	LatencyEvery time.Duration `json:"latencyEvery,omitempty"`
	// Auth says which credentials probes present; nil presents none. An External proxy's
	// Secret is read again every DriftInterval.
	Auth *ProbeAuth `json:"auth,omitempty"`
}

// MonitorResult is a change worth recording.
type MonitorResult struct {
	Reason   string            `json:"reason"`
	Health   Health            `json:"health"`
	Instance provider.Instance `json:"instance,omitempty"`
	// Sealed is set with MonitorCredentials.
	Sealed string `json:"sealed,omitempty"`
}

// monitorProgress is heartbeated, so a Monitor resumed on another worker keeps its counts.
type monitorProgress struct {
	Health Health `json:"health"`
	// Recent holds the latencies of the last successful probes; their median is what is
	// reported, so one or two slow probes on a busy machine are not a latency change.
	Recent     []int64   `json:"recent,omitempty"`
	ConsecOK   int       `json:"consecOK"`
	ConsecFail int       `json:"consecFail"`
	LastReport time.Time `json:"lastReport"`
	LastDrift  time.Time `json:"lastDrift"`
	// Reported is the FailureReason the workflow was last told, ReasonAt when a report
	// changed only that reason (MonitorTarget), which is rate-limited. Neither is
	// heartbeated: a Monitor activity returns at its first report and takes Reported from
	// its input, which is the workflow's verdict; a shard's member keeps both between
	// reports.
	Reported string    `json:"-"`
	ReasonAt time.Time `json:"-"`
}

// Monitor probes the proxy every interval (with jitter) and checks the provider every drift
// interval. It returns only when something is worth writing down, so a stable proxy adds
// nothing to workflow history. It heartbeats after every probe (the SDK sends at most one
// heartbeat per 0.8 × the heartbeat timeout), and a Monitor resumed on another worker
// carries on from the counters of the last one.
func (a *Activities) Monitor(ctx context.Context, in MonitorInput) (MonitorResult, error) {
	st := monitorProgress{Health: in.Last, LastReport: time.Now()}
	resumed := false
	if activity.HasHeartbeatDetails(ctx) {
		var prev monitorProgress
		if err := activity.GetHeartbeatDetails(ctx, &prev); err == nil {
			st, resumed = prev, true
		}
	}
	st.Reported = in.Last.FailureReason
	// A resumed attempt's predecessor made the provider check an unhealthy start makes.
	// Its health-check target is judged by no one: older workflows watch each proxy alone.
	return a.watch(ctx, in, &st, resumed, !resumed, nil, func(st monitorProgress) { activity.RecordHeartbeat(ctx, st) })
}

// watch is one proxy's watch: it probes and checks the provider until something is worth
// writing down, and returns it. st holds the counters, so a caller that watches on after a
// change (rather than starting a new Monitor) keeps them; resumed says they came from
// another process (the probe cadence carries on). checkFirst asks the provider first about
// a proxy that starts unhealthy. judge, if set, records each probe with the probes of the
// other proxies of its health-check target and says whether the target is judged down.
// beat, if set, is told them after every probe.
func (a *Activities) watch(ctx context.Context, in MonitorInput, st *monitorProgress, resumed, checkFirst bool, judge targetJudge, beat func(monitorProgress)) (MonitorResult, error) {
	interval, err := in.HealthCheck.EffectiveInterval()
	if err != nil {
		return MonitorResult{}, classify("monitor", err)
	}
	timeout, err := in.HealthCheck.EffectiveTimeout()
	if err != nil {
		return MonitorResult{}, classify("monitor", err)
	}
	defer a.Metrics.monitorStarted()()
	success, failure := in.HealthCheck.EffectiveThresholds()
	th := thresholds{success: success, failure: failure, latency: orDefault(in.LatencyEvery, 10*time.Minute)}
	var prv provider.Provider
	var providerID string
	if in.Instance != nil {
		if prv, providerID, err = a.locate(*in.Instance); err != nil {
			return MonitorResult{}, classify("monitor", err)
		}
	}
	drift := orDefault(in.DriftInterval, 2*time.Minute)
	if st.LastDrift.IsZero() {
		st.LastDrift = time.Now()
	}
	// An External proxy's Secret is read now and every drift interval: a rotated password
	// reaches the probes and, through the workflow's memo, the next lease.
	creds := a.probeCredentials(ctx, in.Auth, false)
	if in.Auth != nil && creds.sealed != in.Auth.Sealed {
		st.Reported = st.Health.FailureReason
		return MonitorResult{Reason: MonitorCredentials, Health: st.Health, Sealed: creds.sealed}, nil
	}
	lastCreds := time.Now()

	// An unhealthy proxy is checked at the provider before anything else: the verdict that
	// turned it unhealthy was returned without waiting for the provider (a slow cloud API
	// must not keep a dead proxy leasable), so the check it skipped happens here, and a
	// killed, stopped or preempted instance is still replaced at once.
	if prv != nil && checkFirst && st.Health.Known && !st.Health.Healthy {
		st.LastDrift = time.Now()
		if lost, ok := a.drift(ctx, prv, string(in.Instance.Provider), providerID, st.Health); ok {
			return lost, nil
		}
	}

	wait := firstWait(st.Health, resumed, interval, time.Now(), randomBelow)
	for {
		select {
		case <-ctx.Done():
			return MonitorResult{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = jitter(interval)

		if in.Auth != nil && in.Auth.Secret != "" && time.Since(lastCreds) >= drift {
			lastCreds = time.Now()
			if creds = a.probeCredentials(ctx, in.Auth, true); creds.sealed != in.Auth.Sealed {
				st.Reported = st.Health.FailureReason
				return MonitorResult{Reason: MonitorCredentials, Health: st.Health, Sealed: creds.sealed}, nil
			}
		}
		var res probe.Result
		if creds.problem != "" {
			res = probe.Result{Kind: probe.KindProxyAuth, Message: creds.problem}
		} else {
			res = a.prober().Probe(ctx, probe.Request{
				Proxy: in.Target, URL: in.HealthCheck.URL, Timeout: timeout,
				ExpectedStatus: in.HealthCheck.EffectiveExpectedStatus(), Credentials: creds.creds,
			})
		}
		if ctx.Err() != nil {
			return MonitorResult{}, ctx.Err()
		}
		a.Metrics.probed(res)
		now := time.Now()
		var target targetJudgement
		if judge != nil {
			target = judge(res, now)
		}
		reason, changed := th.fold(st, res, target, creds.reason, now)
		// A change is returned before any provider call; the next Monitor of a proxy that
		// turned unhealthy checks the provider first thing.
		if changed {
			return MonitorResult{Reason: reason, Health: st.Health}, nil
		}
		if prv != nil && now.Sub(st.LastDrift) >= drift {
			st.LastDrift = now
			if lost, ok := a.drift(ctx, prv, string(in.Instance.Provider), providerID, st.Health); ok {
				return lost, nil
			}
		}
		if beat != nil {
			beat(*st)
		}
	}
}

// firstWait is how long a Monitor waits before its first probe. A proxy with no verdict is
// probed at once. Otherwise the probe cadence carries on from the last probe, so a Monitor
// the workflow restarts after a verdict does not add a pause to the next failure's detection
// time. A probe long overdue waits a random part of the interval when the Monitor resumed
// on another worker, so a restarted worker does not probe its whole fleet in one second; a
// workflow's own restart probes at once. random(d) is a random duration in [0, d): it is
// passed in so the decision can be tested apart from the dice.
func firstWait(last Health, resumed bool, interval time.Duration, now time.Time, random func(time.Duration) time.Duration) time.Duration {
	if !last.Known && !resumed {
		return 0
	}
	if !last.CheckedAt.IsZero() {
		// Clamped to one interval: the last probe may have run on a worker whose clock
		// was ahead of this one's.
		if wait := min(last.CheckedAt.Add(interval).Sub(now), interval); wait >= 0 {
			return wait
		}
	}
	if resumed || last.CheckedAt.IsZero() {
		return random(interval)
	}
	return 0
}

// randomBelow is a random duration in [0, d), d > 0.
func randomBelow(d time.Duration) time.Duration { return time.Duration(rand.Int64N(int64(d))) }

// drift asks the provider about the instance and reports it lost (gone, or stopped for
// good) if so. A failed check is logged and tried again later: it proves nothing.
func (a *Activities) drift(ctx context.Context, prv provider.Provider, providerName, providerID string, h Health) (MonitorResult, bool) {
	cctx, cancel := a.callContext(ctx)
	defer cancel()
	inst, err := prv.Get(cctx, providerID)
	switch {
	case errors.Is(err, provider.ErrNotFound):
		return MonitorResult{Reason: MonitorGone, Health: h}, true
	case err != nil:
		a.log().WarnContext(ctx, "drift check failed", "providerID", providerID, "error", err)
	case inst.State == provider.StateDeleting:
		// Deleted behind the workflow's back and on its way out: as good as gone.
		return MonitorResult{Reason: MonitorGone, Health: h}, true
	case inst.State == provider.StateStopped:
		if inst.Preempted {
			a.Metrics.preempted(providerName)
		}
		return MonitorResult{Reason: MonitorStopped, Health: h, Instance: inst}, true
	}
	return MonitorResult{}, false
}

func (a *Activities) prober() Prober {
	if a.Prober != nil {
		return a.Prober
	}
	return probe.Prober{}
}

// thresholds decide when probe results become a recorded change.
type thresholds struct {
	success, failure int
	latency          time.Duration
}

// record folds one probe result into st and reports whether it is worth returning for.
// A verdict flips only after a full run of successes or failures; a latency change counts
// only while healthy, only when the median of the recent probes moves by more than
// max(20ms, 50%), and at most once per latency interval, so jitter never writes status.
func (th thresholds) record(st *monitorProgress, res probe.Result, now time.Time) (string, bool) {
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
		return MonitorVerdict, true
	case (!h.Known || h.Healthy) && st.ConsecFail >= th.failure:
		h.Known, h.Healthy, h.Since = true, false, now
		st.LastReport = now
		return MonitorVerdict, true
	case h.Known && h.Healthy && res.OK && now.Sub(st.LastReport) >= th.latency:
		delta := latency - h.LatencyMillis
		if delta < 0 {
			delta = -delta
		}
		if delta > max(20, h.LatencyMillis/2) {
			h.LatencyMillis = latency
			st.LastReport = now
			return MonitorLatency, true
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
// A change of that reason alone is reported (MonitorTarget) at most once per th.latency,
// like a latency change: it changes what the Proxy's status says, not what anyone does, and
// a flapping target would otherwise send a report per proxy per flip. Verdicts are never
// held back by it. credsReason is the reason a failure has when the credentials Secret may
// not be used.
func (th thresholds) fold(st *monitorProgress, res probe.Result, target targetJudgement, credsReason string, now time.Time) (string, bool) {
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
			reason, changed = MonitorTarget, true
			st.ReasonAt = now
		case !aboutTarget && h.Known && !h.Healthy:
			// A proxy already unhealthy whose failure now has another reason (its Secret,
			// missing until now, turned up without the label; or was labelled but lacks
			// its keys) says so: the condition must name what the user has to fix.
			reason, changed = MonitorVerdict, true
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

// jitter spreads probes of many proxies over time: ±10% of the interval.
func jitter(d time.Duration) time.Duration {
	span := int64(d) / 5
	if span <= 0 {
		return d
	}
	return d - time.Duration(span/2) + time.Duration(rand.Int64N(span))
}
