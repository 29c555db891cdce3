package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows"
)

// RecordHistory saves a workflow's history (its latest run) into
// workflows/testdata/histories/v<LatestVersion> when RECORD_HISTORIES is set, so the replay
// test there checks that today's workflow code still replays the histories of real runs.
// Older versions' directories are left as they are. Run `make record-histories` after a
// change that needed a new workflow version (docs/operations.md).
func RecordHistory(t *testing.T, s *stack.Stack, workflowID, file string) {
	t.Helper()
	RecordRun(t, s, workflowID, "", file)
}

// RecordRun records one run of a workflow (runID "" is the latest).
func RecordRun(t *testing.T, s *stack.Stack, workflowID, runID, file string) {
	t.Helper()
	if os.Getenv("RECORD_HISTORIES") == "" {
		return
	}
	ctx := context.Background()
	it := s.Temporal.Client.GetWorkflowHistory(ctx, workflowID, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var h historypb.History
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, ev)
	}
	raw, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(&h)
	require.NoError(t, err)
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	path := filepath.Join(root, "workflows", "testdata", "histories", fmt.Sprintf("v%d", workflows.LatestVersion), file)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	t.Logf("recorded %d events of %s into %s", len(h.Events), workflowID, path)
}
