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
func TestQueries(t *testing.T) {
	assert.Equal(t, `WorkflowId STARTS_WITH "proxy/" AND ExecutionStatus = 'Running'`, RunningProxiesQuery)
	since := time.Date(2026, 11, 30, 12, 0, 0, 500, time.FixedZone("x", 3600))
	assert.Equal(t, `WorkflowId STARTS_WITH "proxy/" AND (ProxyUpdatedAt > "2026-11-30T11:00:00.0000005Z" OR (ExecutionStatus != 'Running' AND CloseTime > "2026-11-30T11:00:00.0000005Z"))`,
		ProxiesUpdatedSinceQuery(since))
}
