package workflows

import "go.temporal.io/sdk/workflow"

// ProxyWorkflow's versions. A run records the version it started with (one marker, first
// thing), and policyFor turns it into the runPolicy every later decision reads. Code for an
// older version stays until no run of it can still be open: at most MaxRunAge after the
// newer version was deployed (docs/operations.md, "Shipping a workflow change").
const (
	versionChangeID = "proxy-workflow"
	// versionLongLived: a run ends by continue-as-new on a budget of events, bytes, signals
	// and age, also while steady or idle; reports are published while idle too; a run that
	// starts without state first finds and adopts what earlier runs left.
	versionLongLived workflow.Version = 1
	// versionCredentials: a Managed instance without credentials (built before instances
	// had them, so it carries no fleet key) is replaced make-before-break by one that
	// requires them.
	versionCredentials workflow.Version = 2
	// versionLostFirst: an instance lost behind the workflow's back (gone, stopped,
	// preempted) is replaced before what is left of it is deleted, so the Proxy is back as
	// soon as a new instance can boot.
	versionLostFirst workflow.Version = 3
	// versionShardMonitor: the proxy is watched by a monitor shard, not by an activity of
	// its own. The run publishes what to watch in its memo (activities.MonitorMemo) and
	// takes the shard's reports as signals, so a healthy proxy costs no heartbeats.
	versionShardMonitor workflow.Version = 4
	// versionServeWhileReplacing: the instance being replaced stays leasable (memo
	// Healthy) while it is healthy, until its replacement is verified and promoted; and a
	// shard's report is applied in whatever step it arrives (creating, verifying or
	// deleting an instance, backing off), not only while steady, and published at once.
	versionServeWhileReplacing workflow.Version = 5
	// versionPoolGrants: a pool member's own replacements (maxAge, the unhealthy grace,
	// bans) wait for its pool's grant (ReplaceSignal.Grant), so that a pool replaces at
	// most maxSurge at once whatever asks.
	versionPoolGrants workflow.Version = 6
	versionLatest                      = versionPoolGrants
)

// LatestVersion is the version new runs start with. `make record-histories` writes the
// histories it records into workflows/testdata/histories/v<LatestVersion>, beside those of
// older versions, which the replay test keeps replaying until their code is retired.
const LatestVersion = int(versionLatest)

// runPolicy is what a run does differently by the version it started with, named by the
// behaviour rather than the number: built once, by policyFor, so no decision compares
// versions and a new version is one field and one line there. The state carries a copy for
// the core's decisions (it is never serialised: a continued run builds its own).
//
// Every field's zero value is today's behaviour except legacy's, so a zero policy (what the
// core's table tests start from) decides as the first long-lived version did.
type runPolicy struct {
	// legacy (version 0): none of what versionLongLived added — no budget checks or
	// publishing while waiting, no status rewrite timer, a failed finalizer release fails
	// the run, a run without state does not look for instances first.
	legacy bool
	// requireAuth (versionCredentials): a Managed instance without credentials is replaced.
	requireAuth bool
	// createFirst (versionLostFirst): a lost instance's replacement is created before the
	// lost one is deleted.
	createFirst bool
	// shardWatched (versionShardMonitor): a monitor shard watches the proxy from the memo
	// the run publishes (watch and verdict); its reports arrive as signals; steady's wake
	// timer is kept across the reports that end one steady wait.
	shardWatched bool
	// serveWhileReplacing (versionServeWhileReplacing): the instance being replaced stays
	// leasable while healthy; reports are applied in every step and published while a step
	// runs; a replacement lost mid-step hands over to the one under way (nextOnLoss);
	// live instances go on while a failed delete waits for its retry (liveWhileDeleting).
	serveWhileReplacing bool
	// poolGrants (versionPoolGrants): a pool member's own replacements wait for its pool's
	// grant (see askReplace). Older runs ignore the pool named in a spec signal: their
	// histories were written replacing at once.
	poolGrants bool
}

// policyFor is the policy of a run that started with version v.
func policyFor(v workflow.Version) runPolicy {
	return runPolicy{
		legacy:              v < versionLongLived,
		requireAuth:         v >= versionCredentials,
		createFirst:         v >= versionLostFirst,
		shardWatched:        v >= versionShardMonitor,
		serveWhileReplacing: v >= versionServeWhileReplacing,
		poolGrants:          v >= versionPoolGrants,
	}
}

// bounded says the run keeps to its budget while it waits (versionLongLived).
func (p runPolicy) bounded() bool { return !p.legacy }
