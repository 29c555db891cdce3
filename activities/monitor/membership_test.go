package monitor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
	"github.com/proxyfleet/proxyfleet/workflows/proxyruns"
)

// memo is a watch of epoch whose run knows a verdict or not.
func memo(epoch string, known bool) *Memo {
	return &Memo{Epoch: epoch, Input: Input{Last: Health{Known: known, Healthy: known}}}
}

// TestFollow: a member is kept while its workflow publishes the same watch, restarted for a
// new epoch or for the same one published by another run that knows no verdict (a run
// started again after a terminate), and stopped when there is nothing to watch.
func TestFollow(t *testing.T) {
	running := &watching{epoch: "e1", run: "r1"}
	cases := []struct {
		name string
		cur  *watching
		w    watch
		want memberChange
	}{
		{"no member, nothing to watch", nil, watch{run: "r1"}, memberKeep},
		{"no member, a watch: start", nil, watch{memo("e1", false), "r1"}, memberStart},
		{"the same epoch of the same run", running, watch{memo("e1", false), "r1"}, memberKeep},
		{"the same epoch of the same run, a verdict known", running, watch{memo("e1", true), "r1"}, memberKeep},
		{"a new epoch", running, watch{memo("e2", true), "r1"}, memberRestart},
		{"a new epoch of a new run", running, watch{memo("e2", true), "r2"}, memberRestart},
		{"a run that continued as new carries its verdict on", running, watch{memo("e1", true), "r2"}, memberKeep},
		{"a run started again knows no verdict: it must be told one", running, watch{memo("e1", false), "r2"}, memberRestart},
		{"the workflow closed", running, watch{run: "r1"}, memberStop},
		{"a new run publishes nothing to watch", running, watch{run: "r2"}, memberStop},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, follow(tc.cur, tc.w))
		})
	}
}

// TestSameWatch: a read found a change when a watch's epoch or run differs, or one
// appeared or went.
func TestSameWatch(t *testing.T) {
	e1 := memo("e1", false)
	cases := []struct {
		name string
		x, y watch
		want bool
	}{
		{"none and none", watch{}, watch{run: "r1"}, true},
		{"none and one", watch{}, watch{e1, "r1"}, false},
		{"one and none", watch{e1, "r1"}, watch{run: "r1"}, false},
		{"the same epoch and run", watch{e1, "r1"}, watch{memo("e1", true), "r1"}, true},
		{"another epoch", watch{e1, "r1"}, watch{memo("e2", false), "r1"}, false},
		{"another run", watch{e1, "r1"}, watch{e1, "r2"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, sameWatch(tc.x, tc.y))
		})
	}
}

// TestWatchOf: a run listed as the workflow's asks for its memo's watch while it runs, and
// for none once it closed (or when it publishes none).
func TestWatchOf(t *testing.T) {
	e1 := memo("e1", false)
	latest := []proxyruns.Latest[*Memo]{
		{Run: proxyruns.Run{WorkflowID: "running", RunID: "r1", ListedRun: contract.ListedRun{Running: true}}, Value: e1},
		{Run: proxyruns.Run{WorkflowID: "closed", RunID: "r2"}, Value: e1},
		{Run: proxyruns.Run{WorkflowID: "older", RunID: "r3", ListedRun: contract.ListedRun{Running: true}}},
	}
	assert.Equal(t, watch{e1, "r1"}, watchOf(latest[0]))
	assert.Equal(t, watch{run: "r2"}, watchOf(latest[1]), "a closed run's memo is no watch")
	assert.Equal(t, watch{run: "r3"}, watchOf(latest[2]))
	assert.Equal(t, map[string]watch{"running": {e1, "r1"}}, watchesOf(latest), "a full read lists only the watches")
}

// TestFullSyncs: after a full read, a shard's members follow every watch it owns, and those
// it owned that are no longer listed stop; another shard's workflows are left alone.
func TestFullSyncs(t *testing.T) {
	e1, e2 := memo("e1", true), memo("e2", true)
	known := map[string]watch{"mine-kept": {e1, "r"}, "mine-gone": {e1, "r-gone"}, "theirs-gone": {e1, "r"}}
	want := map[string]watch{"mine-kept": {e2, "r"}, "mine-new": {e1, "r"}, "theirs-new": {e1, "r"}}
	owns := func(id string) bool { return id[:4] == "mine" }
	assert.Equal(t, map[string]watch{
		"mine-kept": {e2, "r"},
		"mine-new":  {e1, "r"},
		"mine-gone": {run: "r-gone"},
	}, fullSyncs(known, want, owns))
	assert.Empty(t, fullSyncs(known, want, func(string) bool { return false }))
}

// TestFullChanged: a full read found a change when a watch came, went, or changed epoch or
// run; reading the same again is no change.
func TestFullChanged(t *testing.T) {
	e1, e2 := memo("e1", true), memo("e2", true)
	known := map[string]watch{"a": {e1, "r"}, "b": {e1, "r"}}
	cases := []struct {
		name    string
		want    map[string]watch
		changed bool
	}{
		{"the same", map[string]watch{"a": {e1, "r"}, "b": {e1, "r"}}, false},
		{"the same epoch read again, with a verdict", map[string]watch{"a": {memo("e1", false), "r"}, "b": {e1, "r"}}, false},
		{"one went", map[string]watch{"a": {e1, "r"}}, true},
		{"one came", map[string]watch{"a": {e1, "r"}, "b": {e1, "r"}, "c": {e1, "r"}}, true},
		{"one went and another came", map[string]watch{"a": {e1, "r"}, "c": {e1, "r"}}, true},
		{"a new epoch", map[string]watch{"a": {e2, "r"}, "b": {e1, "r"}}, true},
		{"a new run", map[string]watch{"a": {e1, "r2"}, "b": {e1, "r"}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.changed, fullChanged(known, tc.want))
		})
	}
}

// TestStartFrom: a member starts from the workflow's verdict now when it is of the
// watch's epoch, with the reason a healthy one carries; a verdict of another epoch changes
// nothing.
func TestStartFrom(t *testing.T) {
	since := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	checked := since.Add(time.Minute)
	failing := Health{Known: true, Healthy: false, Since: since, CheckedAt: checked, LastFailure: "refused", FailureKind: "refused"}
	cases := []struct {
		name string
		last Health
		v    Verdict
		want Health
	}{
		{"another epoch's verdict", failing, Verdict{Epoch: "e0", Healthy: true}, failing},
		{"no verdict", failing, Verdict{}, failing},
		{"recovered since the watch began", failing, Verdict{Epoch: "e1", Healthy: true, Since: since, LatencyMillis: 7},
			Health{Known: true, Healthy: true, Since: since, LatencyMillis: 7, CheckedAt: checked}},
		{"healthy while the target is down", failing, Verdict{Epoch: "e1", Healthy: true, Since: since, FailureReason: "HealthCheckTargetDown"},
			Health{Known: true, Healthy: true, Since: since, CheckedAt: checked, FailureReason: "HealthCheckTargetDown"}},
		{"failed since the watch began: the failure is kept", Health{Known: true, Healthy: true, LastFailure: "old"}, Verdict{Epoch: "e1", Since: since},
			Health{Known: true, Healthy: false, Since: since, LastFailure: "old"}},
		{"a watch with no verdict takes the workflow's", Health{}, Verdict{Epoch: "e1", Healthy: true, Since: since},
			Health{Known: true, Healthy: true, Since: since}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := Memo{Epoch: "e1", Input: Input{Target: "t", Last: tc.last}}
			got := startFrom(m, tc.v)
			assert.Equal(t, tc.want, got.Input.Last)
			assert.Equal(t, "t", got.Input.Target)
		})
	}
}

// TestShardInputDefaults: unset paces take their defaults; the idle pace is never faster
// than the busy one.
func TestShardInputDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   ShardInput
		want ShardInput
	}{
		{"all defaults", ShardInput{Index: 1, Count: 4},
			ShardInput{Index: 1, Count: 4, Refresh: time.Second, IdleRefresh: 5 * time.Second, Quiet: 30 * time.Second, Full: 5 * time.Minute, Overlap: 5 * time.Second}},
		{"set ones are kept", ShardInput{Refresh: 50 * time.Millisecond, IdleRefresh: 400 * time.Millisecond, Quiet: 100 * time.Millisecond, Full: time.Minute, Overlap: time.Second},
			ShardInput{Refresh: 50 * time.Millisecond, IdleRefresh: 400 * time.Millisecond, Quiet: 100 * time.Millisecond, Full: time.Minute, Overlap: time.Second}},
		{"an idle pace faster than the busy one is the busy one", ShardInput{Refresh: 10 * time.Second, IdleRefresh: time.Second},
			ShardInput{Refresh: 10 * time.Second, IdleRefresh: 10 * time.Second, Quiet: 30 * time.Second, Full: 5 * time.Minute, Overlap: 5 * time.Second}},
		{"a busy refresh past the idle default lifts it", ShardInput{Refresh: 10 * time.Second},
			ShardInput{Refresh: 10 * time.Second, IdleRefresh: 10 * time.Second, Quiet: 30 * time.Second, Full: 5 * time.Minute, Overlap: 5 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.in.withDefaults())
		})
	}
}

// TestShardPace: the reader keeps its busy pace while changes come, its idle one once none
// has for Quiet.
func TestShardPace(t *testing.T) {
	in := ShardInput{}.withDefaults()
	assert.Equal(t, time.Second, in.pace(0))
	assert.Equal(t, time.Second, in.pace(29*time.Second))
	assert.Equal(t, 5*time.Second, in.pace(30*time.Second))
	assert.Equal(t, 5*time.Second, in.pace(time.Hour), "a reader that never saw a change is idle")
}

func TestShardOfSpreadsAndAgrees(t *testing.T) {
	counts := make([]int, 4)
	for i := range 4000 {
		counts[ShardOf("proxy/ns/p-"+string(rune('a'+i%26))+time.Duration(i).String(), 4)]++
	}
	for k, c := range counts {
		assert.InDelta(t, 1000, c, 150, "shard %d of 4 watches %d of 4,000", k, c)
	}
	assert.Equal(t, ShardOf("proxy/ns/p", 4), ShardOf("proxy/ns/p", 4))
	assert.Zero(t, ShardOf("proxy/ns/p", 1))
}
