package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/activity"

	"github.com/proxyfleet/proxyfleet/activities/monitor"
	"github.com/proxyfleet/proxyfleet/activities/probe"
)

// The monitor lives in package monitor; these are the names workflow code has always used
// for its wire types, kept as aliases: the types, and their JSON in histories and memos,
// are the monitor's.
type (
	Health        = monitor.Health
	MonitorInput  = monitor.Input
	MonitorResult = monitor.Result
	ProbeAuth     = monitor.ProbeAuth
	// Prober sends one probe through a proxy.
	Prober = monitor.Prober
)

// Why a Monitor returned (MonitorResult.Reason).
const (
	MonitorVerdict     = monitor.ReasonVerdict
	MonitorLatency     = monitor.ReasonLatency
	MonitorGone        = monitor.ReasonGone
	MonitorStopped     = monitor.ReasonStopped
	MonitorCredentials = monitor.ReasonCredentials
	MonitorTarget      = monitor.ReasonTarget
)

// Monitor is the watch of workflows of version 3 and older, one activity per proxy: it
// returns only when something is worth writing down (see monitor.Watch). It heartbeats
// after every probe (the SDK sends at most one heartbeat per 0.8 × the heartbeat timeout),
// and a Monitor resumed on another worker carries on from the counters of the last one.
func (a *Activities) Monitor(ctx context.Context, in MonitorInput) (MonitorResult, error) {
	var prev *monitor.Progress
	if activity.HasHeartbeatDetails(ctx) {
		var p monitor.Progress
		if err := activity.GetHeartbeatDetails(ctx, &p); err == nil {
			prev = &p
		}
	}
	res, err := monitor.Watch(ctx, a.monitorEnv(), in, prev, func(st monitor.Progress) { activity.RecordHeartbeat(ctx, st) })
	if ierr := (*monitor.InputError)(nil); errors.As(err, &ierr) {
		return MonitorResult{}, classify("monitor", ierr.Err)
	}
	return res, err
}

// monitorEnv is what the monitor's watches need of this worker. The functions are a's
// methods, so they read a's fields when called, as the activities do.
func (a *Activities) monitorEnv() monitor.Env {
	return monitor.Env{
		Locate:      a.locate,
		CallContext: a.callContext,
		Credentials: a.probeCredentials,
		// Read when used, as the activities read a's fields: a worker's Prober or Log set
		// (or slog's default changed) after its first shard reaches every shard.
		Prober:  activitiesProber{a},
		Metrics: a.Metrics.monitorMetrics(),
		Log:     a.Log,
	}
}

// activitiesProber probes with the Activities' Prober as it is at each probe (probe.Prober's
// defaults when unset), as the activities did before the monitor had a package of its own.
type activitiesProber struct{ a *Activities }

func (p activitiesProber) Probe(ctx context.Context, req probe.Request) probe.Result {
	if p.a.Prober != nil {
		return p.a.Prober.Probe(ctx, req)
	}
	return probe.Prober{}.Probe(ctx, req)
}
