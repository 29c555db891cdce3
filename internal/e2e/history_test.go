package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// recordHistory saves a workflow's history into workflows/testdata when RECORD_HISTORIES is
// set, so the replay test there checks that today's workflow code still replays the
// histories of real runs. Run `make record-histories` after a deliberate change of workflow
// behaviour, with workflow versioning for anything already in production.
func recordHistory(t *testing.T, s *stack.Stack, workflowID, file string) {
	t.Helper()
	if os.Getenv("RECORD_HISTORIES") == "" {
		return
	}
	ctx := context.Background()
	it := s.Temporal.Client.GetWorkflowHistory(ctx, workflowID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
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
	path := filepath.Join(root, "workflows", "testdata", file)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	t.Logf("recorded %d events of %s into %s", len(h.Events), workflowID, path)
}
