// Package proxyinput is what starting a ProxyWorkflow takes: its input, the spec signal
// that carries the Proxy, and the timings a deployment may tune. The operator's controller
// starts and signals workflows with these, and package workflows runs them; both import
// this package, so neither imports the other (the controller would otherwise link the
// workflow code and every activity it calls). It is beside workflows/contract rather than
// in it because the spec signal carries the Kubernetes Proxy spec, which contract's
// readers (discovery) do not link.
package proxyinput

import (
	"time"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Start is the input a ProxyWorkflow starts with: the workflow's ProxyWorkflowInput
// without the state a run carries across continue-as-new, in the same JSON.
type Start struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Installation is this deployment's id, put on every instance as an ownership label.
	Installation string `json:"installation"`
	// Tuning overrides timings; zero fields take defaults. Tests shorten them.
	Tuning Tuning `json:"tuning"`
}

// SpecSignal carries the Proxy's full current spec. The workflow applies a signal only if it
// is newer than what it has: a higher generation, or the same generation with a different
// cloud-init Secret version (a rotation, which does not bump the Proxy's generation).
type SpecSignal struct {
	UID        string `json:"uid"`
	Generation int64  `json:"generation"`
	// SecretVersion is the resourceVersion of the referenced cloud-init Secret, never its
	// data: a change makes the workflow re-hash the Secret in an activity.
	SecretVersion string             `json:"secretVersion,omitempty"`
	Spec          v1alpha1.ProxySpec `json:"spec"`
	// Pool is the ProxyPool that controls the Proxy, if one does: such a Proxy's own
	// replacements (maxAge, the unhealthy grace, bans) wait for the pool to allow them
	// within its surge budget, which it does with a ReplaceSignal that grants.
	Pool string `json:"pool,omitempty"`
}

// Tuning holds the workflow's timings. Defaults suit production; tests shorten them.
type Tuning struct {
	// QuotaRetry is how long to wait after a quota refusal before trying again.
	QuotaRetry time.Duration `json:"quotaRetry,omitempty"`
	// RetryBase and RetryMax bound the backoff after transient failures that outlived the
	// activity's own retries.
	RetryBase time.Duration `json:"retryBase,omitempty"`
	RetryMax  time.Duration `json:"retryMax,omitempty"`
	// PollInterval is how often activities ask the provider about an instance.
	PollInterval time.Duration `json:"pollInterval,omitempty"`
	// WaitRunningMax bounds one WaitRunning activity; the workflow then records that it is
	// still waiting and starts another.
	WaitRunningMax time.Duration `json:"waitRunningMax,omitempty"`
	// ActivityTimeout bounds one provider call (Create); a worker that dies mid-call is
	// noticed after this long.
	ActivityTimeout time.Duration `json:"activityTimeout,omitempty"`
	// HeartbeatTimeout is how soon a dead worker's long-running activities (waits, deletes)
	// are moved to another worker.
	HeartbeatTimeout time.Duration `json:"heartbeatTimeout,omitempty"`
	// DriftInterval is how often the monitor checks the provider that the instance exists.
	DriftInterval time.Duration `json:"driftInterval,omitempty"`
	// HistoryLimit forces continue-as-new after this many history events; 0 takes
	// DefaultHistoryLimit (runs that started before versionBoundedRuns: the server's
	// suggestion only).
	HistoryLimit int `json:"historyLimit,omitempty"`
	// MaxRunBytes, MaxRunSignals and MaxRunAge end a run by continue-as-new after this much
	// history, this many signals, or this long, whichever comes first.
	MaxRunBytes   int           `json:"maxRunBytes,omitempty"`
	MaxRunSignals int           `json:"maxRunSignals,omitempty"`
	MaxRunAge     time.Duration `json:"maxRunAge,omitempty"`
}

// Run budget defaults. The server warns at 10,240 events or 10 MB and terminates a run at
// 51,200 events or 50 MB; it refuses signals past 10,000 per run. A run ends well before any
// of these: a report costs about six events (signal, workflow task, memo and search
// attribute upserts), so 1,000 signals stay under the event budget too.
const (
	DefaultHistoryLimit  = 8000
	DefaultMaxRunBytes   = 8 << 20
	DefaultMaxRunSignals = 1000
	// DefaultMaxRunAge lets a stable proxy's run end too, so workflow code versions and
	// tuning older than this can retire.
	DefaultMaxRunAge = 72 * time.Hour
)

// WithDefaults fills zero fields.
func (t Tuning) WithDefaults() Tuning {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&t.QuotaRetry, 5*time.Minute)
	def(&t.RetryBase, 5*time.Second)
	def(&t.RetryMax, 5*time.Minute)
	def(&t.PollInterval, 5*time.Second)
	def(&t.WaitRunningMax, 10*time.Minute)
	def(&t.DriftInterval, 2*time.Minute)
	def(&t.ActivityTimeout, 2*time.Minute)
	def(&t.HeartbeatTimeout, 30*time.Second)
	def(&t.MaxRunAge, DefaultMaxRunAge)
	if t.MaxRunBytes <= 0 {
		t.MaxRunBytes = DefaultMaxRunBytes
	}
	if t.MaxRunSignals <= 0 {
		t.MaxRunSignals = DefaultMaxRunSignals
	}
	return t
}

// Backoff is RetryBase·2^(attempt-1), capped at RetryMax.
func (t Tuning) Backoff(attempt int) time.Duration {
	d := t.RetryBase
	for i := 1; i < attempt && d < t.RetryMax; i++ {
		d *= 2
	}
	return min(d, t.RetryMax)
}
