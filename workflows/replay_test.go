package workflows

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// recordedHistories are every history recorded from real runs on the Temporal dev server
// (internal/e2e with RECORD_HISTORIES=1), one directory per workflow version.
func recordedHistories(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "histories", "v*", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no recorded histories in testdata/histories")
	return files
}

// TestReplayRecordedHistories replays every recorded history, of every version still
// supported. A change to a workflow that would break open runs fails here: it needs a new
// version (see docs/operations.md), not a new recording.
func TestReplayRecordedHistories(t *testing.T) {
	for _, f := range recordedHistories(t) {
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(ProxyWorkflow, workflow.RegisterOptions{Name: contract.ProxyWorkflowType})
			r.RegisterWorkflowWithOptions(GCWorkflow, workflow.RegisterOptions{Name: contract.GCWorkflowType})
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(nil, f))
		})
	}
}
