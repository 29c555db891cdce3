package workflows

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.temporal.io/sdk/workflow"
)

// TestPolicyFor: each version turns on what it added and keeps what came before.
func TestPolicyFor(t *testing.T) {
	assert.Equal(t, runPolicy{legacy: true}, policyFor(workflow.DefaultVersion))
	assert.Equal(t, runPolicy{}, policyFor(versionLongLived))
	assert.Equal(t, runPolicy{requireAuth: true}, policyFor(versionCredentials))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true}, policyFor(versionLostFirst))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true, shardWatched: true}, policyFor(versionShardMonitor))
	assert.Equal(t, runPolicy{requireAuth: true, createFirst: true, shardWatched: true, serveWhileReplacing: true}, policyFor(versionServeWhileReplacing))
	assert.Equal(t, policyFor(versionServeWhileReplacing), policyFor(versionLatest))
}
