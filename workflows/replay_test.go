package workflows

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReplayRecordedHistories replays histories recorded from real runs on the Temporal dev
// server (internal/e2e with RECORD_HISTORIES=1). A change to ProxyWorkflow that would break
// running workflows fails here: it needs workflow.GetVersion, not a new recording.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no recorded histories in testdata")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(ProxyWorkflow, workflow.RegisterOptions{Name: contract.ProxyWorkflowType})
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(nil, f))
		})
	}
}
