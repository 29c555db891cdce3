package workflows

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
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
			r.RegisterWorkflowWithOptions(MonitorShardWorkflow, workflow.RegisterOptions{Name: contract.MonitorShardWorkflowType})
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(nil, f))
		})
	}
}

// TestCorpusCoversEveryPath: the histories recorded for the latest version walk every path
// a change could break: each activity, each timer the workflow sets, each signal, a run
// that continues as new and one that starts from continued state, a run that adopts, and a
// GC sweep. A new version must record them all again (make record-histories).
func TestCorpusCoversEveryPath(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "histories", fmt.Sprintf("v%d", LatestVersion), "*.json"))
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		hist, err := client.HistoryFromJSON(fh, client.HistoryJSONOptions{})
		fh.Close()
		require.NoError(t, err)
		for _, ev := range hist.Events {
			switch {
			case ev.GetWorkflowExecutionStartedEventAttributes() != nil:
				a := ev.GetWorkflowExecutionStartedEventAttributes()
				seen["workflow "+a.GetWorkflowType().GetName()] = true
				if a.GetContinuedExecutionRunId() != "" {
					seen["started from continued state"] = true
				}
			case ev.GetActivityTaskScheduledEventAttributes() != nil:
				seen["activity "+ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()] = true
			case ev.GetMarkerRecordedEventAttributes().GetMarkerName() == "LocalActivity":
				var la struct{ ActivityType string }
				if p := ev.GetMarkerRecordedEventAttributes().GetDetails()["data"]; p != nil {
					_ = converter.GetDefaultDataConverter().FromPayloads(p, &la)
				}
				seen["local activity "+la.ActivityType] = true
			case ev.GetTimerStartedEventAttributes() != nil:
				if sum := ev.GetUserMetadata().GetSummary(); sum != nil {
					var text string
					_ = converter.GetDefaultDataConverter().FromPayload(sum, &text)
					seen["timer "+text] = true
				}
			case ev.GetWorkflowExecutionSignaledEventAttributes() != nil:
				seen["signal "+ev.GetWorkflowExecutionSignaledEventAttributes().GetSignalName()] = true
			case ev.GetWorkflowExecutionContinuedAsNewEventAttributes() != nil:
				seen["continued as new"] = true
			}
		}
	}
	for _, want := range []string{
		"workflow " + contract.ProxyWorkflowType, "workflow " + contract.GCWorkflowType,
		"activity FindInstances", "activity CreateInstance", "activity WaitRunning", "activity DeleteInstance",
		"workflow " + contract.MonitorShardWorkflowType, "activity MonitorShard", "signal " + contract.SignalMonitor,
		"activity SweepProvider",
		"local activity PublishStatus", "local activity ReleaseFinalizer", "local activity HashCloudInit",
		"timer " + wakeMaxAge, "timer " + wakeUnhealthy, "timer " + wakeRetry, "timer " + wakeRunAge,
		"signal " + contract.SignalSpec, "signal " + contract.SignalDelete, "signal " + contract.SignalReport,
		"signal " + contract.SignalReplace,
		"continued as new", "started from continued state",
	} {
		assert.True(t, seen[want], "no recorded history of version %d has %q", LatestVersion, want)
	}
}
