package workflows

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities"
)

// TestMonitorShardWorkflowKeepsItsShardRunning: whenever the shard's activity ends, the
// workflow starts it again, and after a bounded number of runs it continues as new.
func TestMonitorShardWorkflowKeepsItsShardRunning(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	acts := &activities.Activities{}
	env.RegisterActivity(acts)
	in := activities.ShardInput{Index: 1, Count: 4}
	calls := 0
	env.OnActivity(acts.MonitorShard, mock.Anything, in).Return(func(context.Context, activities.ShardInput) error {
		calls++
		return nil
	})
	env.ExecuteWorkflow(MonitorShardWorkflow, in)
	require.True(t, env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, env.GetWorkflowError(), &can)
	assert.Equal(t, shardRunsPerWorkflowRun, calls)
}

// TestMonitorShardWorkflowStopsOnAPermanentError: a shard that cannot exist (outside its
// count) fails the workflow instead of being started again forever.
func TestMonitorShardWorkflowStopsOnAPermanentError(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	acts := &activities.Activities{}
	env.RegisterActivity(acts)
	calls := 0
	env.OnActivity(acts.MonitorShard, mock.Anything, mock.Anything).Return(func(context.Context, activities.ShardInput) error {
		calls++
		return temporal.NewNonRetryableApplicationError("monitor shard 4 of 4 does not exist", activities.ErrTypePermanent, nil)
	})
	env.ExecuteWorkflow(MonitorShardWorkflow, activities.ShardInput{Index: 4, Count: 4})
	require.True(t, env.IsWorkflowCompleted())
	require.Error(t, env.GetWorkflowError())
	assert.Contains(t, env.GetWorkflowError().Error(), "does not exist")
	assert.Equal(t, 1, calls)
}
