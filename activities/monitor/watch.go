package monitor

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Env is what a watch needs of the worker it runs in. The worker's activities build it:
// what they hold (providers, the fleet key, the Kubernetes client, the Temporal activity's
// heartbeat timeout) stays theirs, and a watch asks only these questions.
type Env struct {
	// Locate finds the provider that holds an instance and the instance's ID there.
	Locate func(InstanceInput) (provider.Provider, string, error)
	// CallContext bounds one provider call: a hung cloud API fails the call, which is
	// tried again at the next drift check, instead of holding the watch.
	CallContext func(context.Context) (context.Context, context.CancelFunc)
	// Credentials resolves what probes present (see Credentials); reseal is set at the
	// drift interval, when credentials sealed under an older key may be sealed again.
	// Required when an Input has Auth.
	Credentials func(ctx context.Context, auth *ProbeAuth, reseal bool) Credentials
	// Prober sends the probes; nil sends them with probe.Prober's defaults.
	Prober Prober
	// Metrics may be nil; Log nil logs to slog.Default().
	Metrics *Metrics
	Log     *slog.Logger
}

// Prober sends one probe through a proxy.
type Prober interface {
	Probe(ctx context.Context, req probe.Request) probe.Result
}

// Credentials are what a probe presents, or why it cannot present anything.
type Credentials struct {
	Creds proxyauth.Credentials
	// Sealed is the External credentials as sealed now; it differs from ProbeAuth.Sealed
	// when the Secret changed, and the watch then returns them (ReasonCredentials).
	Sealed string
	// Problem, when set, fails the probe without sending it: a proxy whose credentials
	// cannot be had is unhealthy for the same reason a proxy refusing them is.
	Problem string
	// Reason is the Healthy condition's reason for Problem when ProbeFailed would not say
	// it (a v1alpha1.Reason* constant).
	Reason string
}

func (e Env) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.Default()
}

func (e Env) prober() Prober {
	if e.Prober != nil {
		return e.Prober
	}
	return probe.Prober{}
}

// credentials resolves auth; nil presents none.
func (e Env) credentials(ctx context.Context, auth *ProbeAuth, reseal bool) Credentials {
	if auth == nil {
		return Credentials{}
	}
	return e.Credentials(ctx, auth, reseal)
}

// InputError is a watch that cannot start: a health check the schema should have
// refused, or an instance at a provider this worker does not have. Err is the cause, for
// the Monitor activity to classify as it classifies a provider's errors.
type InputError struct{ Err error }

func (e *InputError) Error() string { return "monitor: " + e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// Progress is a watch's counters. The Monitor activity heartbeats it, so a Monitor resumed
// on another worker keeps its counts; a shard's member keeps it from one report to the
// next.
type Progress struct {
	Health Health `json:"health"`
	// Recent holds the latencies of the last successful probes; their median is what is
	// reported, so one or two slow probes on a busy machine are not a latency change.
	Recent     []int64   `json:"recent,omitempty"`
	ConsecOK   int       `json:"consecOK"`
	ConsecFail int       `json:"consecFail"`
	LastReport time.Time `json:"lastReport"`
	LastDrift  time.Time `json:"lastDrift"`
	// Reported is the FailureReason the workflow was last told, ReasonAt when a report
	// changed only that reason (ReasonTarget), which is rate-limited. Neither is
	// heartbeated: a Monitor activity returns at its first report and takes Reported from
	// its input, which is the workflow's verdict; a shard's member keeps both between
	// reports.
	Reported string    `json:"-"`
	ReasonAt time.Time `json:"-"`
}

// Watch is the watch of the Monitor activity of older workflows: one proxy, judged alone,
// until its first report. It probes the proxy every interval (with jitter) and checks the
// provider every drift interval, and returns only when something is worth writing down,
// so a stable proxy adds nothing to workflow history. beat, if set, is told the counters
// after every probe, for the activity to heartbeat; prev, if set, are those an attempt on
// another worker heartbeated last, which this one carries on from. An Input that cannot be
// watched is an *InputError.
func Watch(ctx context.Context, env Env, in Input, prev *Progress, beat func(Progress)) (Result, error) {
	st := Progress{Health: in.Last, LastReport: time.Now()}
	resumed := prev != nil
	if resumed {
		st = *prev
	}
	st.Reported = in.Last.FailureReason
	// A resumed attempt's predecessor made the provider check an unhealthy start makes.
	// Its health-check target is judged by no one: older workflows watch each proxy alone.
	return watchProxy(ctx, env, in, &st, resumed, !resumed, nil, beat)
}

// watchProxy is one proxy's watch: it probes and checks the provider until something is worth
// writing down, and returns it. st holds the counters, so a caller that watches on after a
// change (rather than starting a new Monitor) keeps them; resumed says they came from
// another process (the probe cadence carries on). checkFirst asks the provider first about
// a proxy that starts unhealthy. judge, if set, records each probe with the probes of the
// other proxies of its health-check target and says whether the target is judged down.
// beat, if set, is told them after every probe.
func watchProxy(ctx context.Context, env Env, in Input, st *Progress, resumed, checkFirst bool, judge targetJudge, beat func(Progress)) (Result, error) {
	interval, err := in.HealthCheck.EffectiveInterval()
	if err != nil {
		return Result{}, &InputError{err}
	}
	timeout, err := in.HealthCheck.EffectiveTimeout()
	if err != nil {
		return Result{}, &InputError{err}
	}
	defer env.Metrics.monitorStarted()()
	success, failure := in.HealthCheck.EffectiveThresholds()
	th := thresholds{success: success, failure: failure, latency: orDefault(in.LatencyEvery, 10*time.Minute)}
	var prv provider.Provider
	var providerID string
	if in.Instance != nil {
		if prv, providerID, err = env.Locate(*in.Instance); err != nil {
			return Result{}, &InputError{err}
		}
	}
	drift := orDefault(in.DriftInterval, 2*time.Minute)
	if st.LastDrift.IsZero() {
		st.LastDrift = time.Now()
	}
	// An External proxy's Secret is read now and every drift interval: a rotated password
	// reaches the probes and, through the workflow's memo, the next lease.
	creds := env.credentials(ctx, in.Auth, false)
	if in.Auth != nil && creds.Sealed != in.Auth.Sealed {
		st.Reported = st.Health.FailureReason
		return Result{Reason: ReasonCredentials, Health: st.Health, Sealed: creds.Sealed}, nil
	}
	lastCreds := time.Now()

	// An unhealthy proxy is checked at the provider before anything else: the verdict that
	// turned it unhealthy was returned without waiting for the provider (a slow cloud API
	// must not keep a dead proxy leasable), so the check it skipped happens here, and a
	// killed, stopped or preempted instance is still replaced at once.
	if prv != nil && checkFirst && st.Health.Known && !st.Health.Healthy {
		st.LastDrift = time.Now()
		if lost, ok := checkDrift(ctx, env, prv, string(in.Instance.Provider), providerID, st.Health); ok {
			return lost, nil
		}
	}

	wait := firstWait(st.Health, resumed, interval, time.Now(), randomBelow)
	for {
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = jitter(interval)

		if in.Auth != nil && in.Auth.Secret != "" && time.Since(lastCreds) >= drift {
			lastCreds = time.Now()
			if creds = env.credentials(ctx, in.Auth, true); creds.Sealed != in.Auth.Sealed {
				st.Reported = st.Health.FailureReason
				return Result{Reason: ReasonCredentials, Health: st.Health, Sealed: creds.Sealed}, nil
			}
		}
		var res probe.Result
		if creds.Problem != "" {
			res = probe.Result{Kind: probe.KindProxyAuth, Message: creds.Problem}
		} else {
			res = env.prober().Probe(ctx, probe.Request{
				Proxy: in.Target, URL: in.HealthCheck.URL, Timeout: timeout,
				ExpectedStatus: in.HealthCheck.EffectiveExpectedStatus(), Credentials: creds.Creds,
			})
		}
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		env.Metrics.probed(res)
		now := time.Now()
		var target targetJudgement
		if judge != nil {
			target = judge(res, now)
		}
		reason, changed := th.fold(st, res, target, creds.Reason, now)
		// A change is returned before any provider call; the next Monitor of a proxy that
		// turned unhealthy checks the provider first thing.
		if changed {
			return Result{Reason: reason, Health: st.Health}, nil
		}
		if prv != nil && now.Sub(st.LastDrift) >= drift {
			st.LastDrift = now
			if lost, ok := checkDrift(ctx, env, prv, string(in.Instance.Provider), providerID, st.Health); ok {
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

// checkDrift asks the provider about the instance and reports it lost (gone, or stopped for
// good) if so. A failed check is logged and tried again later: it proves nothing.
func checkDrift(ctx context.Context, env Env, prv provider.Provider, providerName, providerID string, h Health) (Result, bool) {
	cctx, cancel := env.CallContext(ctx)
	defer cancel()
	inst, err := prv.Get(cctx, providerID)
	switch {
	case errors.Is(err, provider.ErrPreempted):
		env.Metrics.preempted(providerName)
		return Result{Reason: ReasonGone, Health: h, Instance: provider.Instance{ProviderID: providerID, Preempted: true}}, true
	case errors.Is(err, provider.ErrNotFound):
		return Result{Reason: ReasonGone, Health: h}, true
	case err != nil:
		env.log().WarnContext(ctx, "drift check failed", "providerID", providerID, "error", err)
	case inst.State == provider.StateDeleting:
		// Deleted behind the workflow's back and on its way out: as good as gone.
		return Result{Reason: ReasonGone, Health: h}, true
	case inst.State == provider.StateStopped:
		if inst.Preempted {
			env.Metrics.preempted(providerName)
		}
		return Result{Reason: ReasonStopped, Health: h, Instance: inst}, true
	}
	return Result{}, false
}

// orDefault is d, or def when d is unset.
func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// jitter spreads probes of many proxies over time: ±10% of the interval.
func jitter(d time.Duration) time.Duration {
	span := int64(d) / 5
	if span <= 0 {
		return d
	}
	return d - time.Duration(span/2) + time.Duration(rand.Int64N(span))
}
