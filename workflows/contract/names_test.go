package contract

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProxyWorkflowIDRoundTrip(t *testing.T) {
	id := ProxyWorkflowID("team-a", "px-1")
	assert.Equal(t, "proxy/team-a/px-1", id)
	ns, name, err := ParseProxyWorkflowID(id)
	require.NoError(t, err)
	assert.Equal(t, []string{"team-a", "px-1"}, []string{ns, name})
	for _, bad := range []string{"proxy-gc", "proxy/", "proxy/ns", "proxy//name", "proxy/ns/", "proxy/ns/a/b"} {
		_, _, err := ParseProxyWorkflowID(bad)
		assert.Error(t, err, bad)
	}
}

// TestQueries pins the visibility queries: discovery and the orphan sweep select the fleet
// with them, and the sweep's copy is recorded in GC workflow histories.
// TestListedRunSupersedes: of two runs of one workflow ID, a running one is the workflow,
// else the one started later, else the one listed later.
func TestListedRunSupersedes(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	old, next := ListedRun{Running: true, Started: t0}, ListedRun{Running: true, Started: t0.Add(time.Second)}
	assert.True(t, next.Supersedes(old))
	assert.False(t, old.Supersedes(next), "a run whose close is not yet visible took its successor's place")
	assert.True(t, old.Supersedes(old), "of two started at once, the one listed later")
	closed := ListedRun{Started: t0.Add(time.Hour)}
	assert.True(t, old.Supersedes(closed), "a running run before a closed one, whenever it started")
	assert.False(t, closed.Supersedes(old))
}

func TestQueries(t *testing.T) {
	assert.Equal(t, `WorkflowId STARTS_WITH "proxy/" AND ExecutionStatus = 'Running'`, RunningProxiesQuery)
	since := time.Date(2026, 11, 30, 12, 0, 0, 500, time.FixedZone("x", 3600))
	assert.Equal(t, `WorkflowId STARTS_WITH "proxy/" AND (ProxyUpdatedAt > "2026-11-30T11:00:00.0000005Z" OR (ExecutionStatus != 'Running' AND CloseTime > "2026-11-30T11:00:00.0000005Z"))`,
		ProxiesUpdatedSinceQuery(since))
}
