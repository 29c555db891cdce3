package monitor

import (
	"time"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The types of this file travel through Temporal: activity inputs and results, heartbeat
// details, signals and memos, recorded in workflow histories that replay for as long as a
// run lives. Their JSON must stay as it is; package activities aliases them under their
// older names (MonitorInput, MonitorResult, …), which workflow code uses.

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

// Why a watch returned (Result.Reason).
const (
	ReasonVerdict = "verdict" // the verdict flipped (or became known)
	ReasonLatency = "latency" // latency moved enough to be worth recording
	ReasonGone    = "gone"    // the instance no longer exists
	ReasonStopped = "stopped" // the instance exists but will not serve again
	// ReasonCredentials: an External proxy's credentials Secret changed; Sealed holds
	// the new ones, sealed, for the workflow to publish.
	ReasonCredentials = "credentials"
	// ReasonTarget: the verdict stands, but whether its health-check target is judged
	// down changed (Health.FailureReason is, or no longer is,
	// v1alpha1.ReasonHealthCheckTargetDown). Sent at most once per LatencyEvery per proxy,
	// so a flapping target costs a bounded number of signals.
	ReasonTarget = "target"
)

// reasons are every Result.Reason, for the metrics to show each from the start.
var reasons = []string{ReasonVerdict, ReasonLatency, ReasonGone, ReasonStopped, ReasonCredentials, ReasonTarget}

// Input configures one watch (a Monitor run, or a shard's member).
type Input struct {
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

// Result is a change worth recording.
type Result struct {
	Reason   string            `json:"reason"`
	Health   Health            `json:"health"`
	Instance provider.Instance `json:"instance,omitempty"`
	// Sealed is set with ReasonCredentials.
	Sealed string `json:"sealed,omitempty"`
}

// ProbeAuth says which credentials a Monitor's probes present. It never holds them: a
// Managed instance's are derived from the fleet key KeyID and the instance name; an External
// proxy's are read from its Secret by the activity, and only their sealed form (see
// internal/proxyauth) travels through the workflow.
type ProbeAuth struct {
	KeyID    string `json:"keyID,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Secret names an External proxy's credentials Secret in Namespace. Sealed is what the
	// workflow holds and publishes, sealed for the Proxy's UID; a Monitor that reads
	// something else from the Secret returns it (ReasonCredentials).
	Namespace string `json:"namespace,omitempty"`
	Secret    string `json:"secret,omitempty"`
	UID       string `json:"uid,omitempty"`
	Sealed    string `json:"sealed,omitempty"`
}

// InstanceInput locates one instance of a Proxy. It is the input of the instance
// activities too (CreateInstance, WaitRunning, DeleteInstance); it lives here because a
// watch carries it (Input.Instance) and this package must not import activities. A watch
// only hands it to Env.Locate.
type InstanceInput struct {
	Provider  v1alpha1.Provider  `json:"provider"`
	Name      string             `json:"name"`
	ProxyUID  string             `json:"proxyUID"`
	Namespace string             `json:"namespace"`
	Spec      v1alpha1.ProxySpec `json:"spec"`
	// ProviderID is empty when Create never returned; it is then derived from the name.
	ProviderID string `json:"providerID,omitempty"`
	// PollInterval is how often to ask the provider; MaxWait bounds WaitRunning.
	PollInterval time.Duration `json:"pollInterval,omitempty"`
	MaxWait      time.Duration `json:"maxWait,omitempty"`
	// SpecHash is the workflow's hash of Spec, labelled on the instance at creation
	// (provider.LabelSpecHash) so a later run without state can tell whether the instance
	// was built from the spec it wants. Empty leaves the label off.
	SpecHash string `json:"specHash,omitempty"`
}

// MemoKey is the memo field where a ProxyWorkflow watched by a shard publishes its Memo.
// It sits beside contract.MemoKey, so discovery never decodes it.
const MemoKey = "monitor"

// Memo is what a shard needs to watch one proxy. Epoch names the watch: it changes
// whenever the input does (apart from Last), so a report about an instance the workflow has
// since replaced is recognised as stale and ignored.
type Memo struct {
	Epoch string `json:"epoch"`
	Input Input  `json:"input"`
}

// VerdictMemoKey is the memo field where a ProxyWorkflow watched by a shard keeps the
// verdict it holds now. The watch carries the verdict of its epoch's start, for it is
// written only when the epoch changes; a member started later (its shard moved to another
// worker, or the worker restarted) starts from this one instead. From a stale one it would
// never report a recovery (or a failure) that the workflow has not been told: it would
// think it had.
const VerdictMemoKey = "verdict"

// Verdict is a watched workflow's current verdict, for the watch of Epoch.
type Verdict struct {
	Epoch         string    `json:"epoch"`
	Healthy       bool      `json:"healthy"`
	Since         time.Time `json:"since,omitempty"`
	LatencyMillis int64     `json:"latencyMillis,omitempty"`
	// FailureReason is the reason a healthy verdict carries (ReasonHealthCheckTargetDown
	// while its target is judged down), from workflows that publish it. Without it a
	// member that starts while the workflow holds that reason cannot know it, and if the
	// target has recovered meanwhile it never reports the reason gone.
	FailureReason string `json:"failureReason,omitempty"`
}

// Report is the signal a shard sends a proxy's workflow: what its watch found, for the
// epoch it watched.
type Report struct {
	Epoch  string `json:"epoch"`
	Result Result `json:"result"`
}

// ShardInput configures one monitor shard.
type ShardInput struct {
	// Index of Count: the shard watches the workflows ShardOf gives Index.
	Index int `json:"index"`
	Count int `json:"count"`
	// Refresh is how often the shard reads what changed in its membership while changes
	// come (default 1s), IdleRefresh how often once none has for Quiet (default 5s after
	// 30s),
	// Full how often it reads all of it (default 5m), Overlap how far back each read
	// reaches, for visibility's lag (default 5s).
	Refresh     time.Duration `json:"refresh,omitempty"`
	IdleRefresh time.Duration `json:"idleRefresh,omitempty"`
	Quiet       time.Duration `json:"quiet,omitempty"`
	Full        time.Duration `json:"full,omitempty"`
	Overlap     time.Duration `json:"overlap,omitempty"`
}
