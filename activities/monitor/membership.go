package monitor

import (
	"hash/fnv"
	"time"

	"github.com/proxyfleet/proxyfleet/workflows/proxyruns"
)

// Membership: which proxies a shard watches, and when a member carries on, starts again or
// stops, decided from what visibility lists. These are plain functions of what was read,
// so every worker decides alike and the rules are tested apart from Temporal; shard.go
// applies them.

// ShardOf is the shard, of count, that watches the ProxyWorkflow workflowID: a hash
// (FNV-1a mod count), so every worker agrees without asking anyone.
func ShardOf(workflowID string, count int) int {
	if count <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(workflowID))
	return int(h.Sum32() % uint32(count))
}

// A watch is a Memo as one run of a workflow published it.
type watch struct {
	memo *Memo // nil: nothing to watch
	run  string
}

// watching is what a member watches: the epoch, and the run that published it (the run
// the member's reports were meant for, though they reach whichever run of the workflow
// ID is current).
type watching struct {
	epoch, run string
}

// memberChange is what a member does when its workflow's watch is read again.
type memberChange int

const (
	memberKeep    memberChange = iota // carries on (or, with no member and no watch, nothing)
	memberStart                       // none runs: one starts
	memberRestart                     // the running one stops, and one starts on the new watch
	memberStop                        // the running one stops: nothing to watch
)

// follow decides what the member watching cur (nil: none) does when its workflow's watch
// reads w. A member runs on (or stays ended: a lost instance, a workflow gone) until a new
// epoch. The same epoch from another run is the same watch when that run knows a verdict
// (it continued as new, carrying it on). One that knows none (a run started again after a
// terminate, which adopts the instance) must be told one, and the member may have told it
// to the run before, which ended before it published anything else: the new run would
// wait for a report that never comes, so the member starts again.
func follow(cur *watching, w watch) memberChange {
	switch {
	case cur == nil && w.memo == nil:
		return memberKeep
	case cur == nil:
		return memberStart
	case w.memo == nil:
		return memberStop
	case cur.epoch == w.memo.Epoch && (cur.run == w.run || w.memo.Input.Last.Known):
		return memberKeep
	}
	return memberRestart
}

// watchOf is the watch a run listed as the workflow's asks for: none once it is closed.
func watchOf(r proxyruns.Latest[*Memo]) watch {
	w := watch{run: r.RunID}
	if r.Running {
		w.memo = r.Value
	}
	return w
}

// watchesOf is the membership a full read lists: every workflow whose run asks for a
// watch.
func watchesOf(latest []proxyruns.Latest[*Memo]) map[string]watch {
	want := map[string]watch{}
	for _, r := range latest {
		if w := watchOf(r); w.memo != nil {
			want[r.WorkflowID] = w
		}
	}
	return want
}

// fullSyncs is what the members of a shard (owns) follow after a full read that found
// want where known was: every owned watch of want, and no watch for an owned workflow
// that is no longer listed (it closed, or publishes nothing to watch).
func fullSyncs(known, want map[string]watch, owns func(id string) bool) map[string]watch {
	out := map[string]watch{}
	for id, w := range known {
		if _, ok := want[id]; !ok && owns(id) {
			out[id] = watch{run: w.run}
		}
	}
	for id, w := range want {
		if owns(id) {
			out[id] = w
		}
	}
	return out
}

// fullChanged reports whether a full read that found want where known was found a
// change: one is what keeps the feed at its busy pace.
func fullChanged(known, want map[string]watch) bool {
	if len(want) != len(known) {
		return true
	}
	for id, w := range want {
		if !sameWatch(known[id], w) {
			return true
		}
	}
	return false
}

// sameWatch reports whether two watches (no memo: none) are the same epoch of the same run.
func sameWatch(x, y watch) bool {
	if x.memo == nil || y.memo == nil {
		return x.memo == y.memo
	}
	return x.memo.Epoch == y.memo.Epoch && x.run == y.run
}

// memoOf decodes what a member needs of a run: its Memo (nil without one; the run is
// listed anyway, so that its watch stops), with the workflow's verdict folded in when it
// is of the memo's epoch.
func memoOf(r proxyruns.Run) (*Memo, bool) {
	var m Memo
	if !proxyruns.Decode(r, MemoKey, &m) || m.Epoch == "" {
		return nil, true
	}
	var v Verdict
	if proxyruns.Decode(r, VerdictMemoKey, &v) {
		m = startFrom(m, v)
	}
	return &m, true
}

// startFrom is the watch m starting from the workflow's verdict v when v is of m's epoch:
// a member starts from the verdict the workflow holds now, not the one of the watch's
// start. The probe counters start afresh, so it reports what differs from it. A verdict of
// another epoch (about an instance since replaced) says nothing about this watch.
func startFrom(m Memo, v Verdict) Memo {
	if v.Epoch != m.Epoch {
		return m
	}
	last := &m.Input.Last
	last.Known, last.Healthy, last.Since, last.LatencyMillis = true, v.Healthy, v.Since, v.LatencyMillis
	if v.Healthy {
		last.LastFailure, last.FailureKind, last.FailureReason = "", "", v.FailureReason
	}
	return m
}

// withDefaults fills in the paces in leaves unset. The idle pace is never faster than the
// busy one.
func (in ShardInput) withDefaults() ShardInput {
	in.Refresh, in.Full, in.Overlap = orDefault(in.Refresh, time.Second), orDefault(in.Full, 5*time.Minute), orDefault(in.Overlap, 5*time.Second)
	in.IdleRefresh, in.Quiet = max(orDefault(in.IdleRefresh, 5*time.Second), in.Refresh), orDefault(in.Quiet, 30*time.Second)
	return in
}

// pace is how long a read of the membership waits after the one before it began, when the
// last change was sinceChange ago. An idle fleet's reads are what its visibility store
// pays for (each scans the queue's proxies on the dev server's SQLite); a fleet in motion
// wants new watches picked up fast.
func (in ShardInput) pace(sinceChange time.Duration) time.Duration {
	if sinceChange < in.Quiet {
		return in.Refresh
	}
	return in.IdleRefresh
}
