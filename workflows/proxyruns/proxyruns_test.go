package proxyruns

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// pages is a Lister that answers one page per call, in order, and records the requests.
type pages struct {
	pages [][]*workflowpb.WorkflowExecutionInfo
	reqs  []*workflowservice.ListWorkflowExecutionsRequest
	err   error
}

func (p *pages) ListWorkflow(_ context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	p.reqs = append(p.reqs, req)
	if p.err != nil {
		return nil, p.err
	}
	i := len(p.reqs) - 1
	resp := &workflowservice.ListWorkflowExecutionsResponse{Executions: p.pages[i]}
	if i+1 < len(p.pages) {
		resp.NextPageToken = []byte{byte(i + 1)}
	}
	return resp, nil
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// run is a listed execution: its ID, run, status, start, memo field "name" (none if
// empty), update time and close time (none if zero).
func run(id, runID string, status enums.WorkflowExecutionStatus, started time.Time, name string, updated, closed time.Time) *workflowpb.WorkflowExecutionInfo {
	ex := &workflowpb.WorkflowExecutionInfo{
		Execution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: runID},
		Status:    status, StartTime: timestamppb.New(started),
		Memo:             &commonpb.Memo{Fields: map[string]*commonpb.Payload{}},
		SearchAttributes: &commonpb.SearchAttributes{IndexedFields: map[string]*commonpb.Payload{}},
	}
	if name != "" {
		p, err := dc.ToPayload(name)
		if err != nil {
			panic(err)
		}
		ex.Memo.Fields["name"] = p
	}
	if !updated.IsZero() {
		p, err := dc.ToPayload(updated)
		if err != nil {
			panic(err)
		}
		ex.SearchAttributes.IndexedFields[contract.SearchAttrUpdatedAt.GetName()] = p
	}
	if !closed.IsZero() {
		ex.CloseTime = timestamppb.New(closed)
	}
	return ex
}

func names(r Run) (string, bool) {
	var n string
	return n, Decode(r, "name", &n)
}

const (
	running   = enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	completed = enums.WORKFLOW_EXECUTION_STATUS_COMPLETED
	continued = enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW
	killed    = enums.WORKFLOW_EXECUTION_STATUS_TERMINATED
)

// TestListKeepsTheRunThatIsTheWorkflow: over pages, each workflow ID keeps the run the
// latest-run rule picks, in the order IDs were first listed; continued-as-new runs and runs
// without what the reader decodes are left out and take no one's place.
func TestListKeepsTheRunThatIsTheWorkflow(t *testing.T) {
	l := &pages{pages: [][]*workflowpb.WorkflowExecutionInfo{
		{
			run("proxy/a/one", "r1", killed, t0, "one-old", t0.Add(time.Minute), t0.Add(2*time.Minute)),
			run("proxy/a/two", "r1", running, t0, "two", t0.Add(time.Minute), time.Time{}),
			// Continued as new: its successor carries on, and its close is no change.
			run("proxy/a/three", "r1", continued, t0, "three-old", t0, t0.Add(time.Hour)),
		},
		{
			run("proxy/a/one", "r2", running, t0.Add(3*time.Minute), "one", t0.Add(4*time.Minute), time.Time{}),
			run("proxy/a/three", "r2", running, t0.Add(time.Hour), "three", t0.Add(5*time.Minute), time.Time{}),
			// Started after two's run but without a memo yet: two's run holds.
			run("proxy/a/two", "r2", running, t0.Add(10*time.Minute), "", t0.Add(6*time.Minute), time.Time{}),
			// A closed run never takes a running one's place, whenever it started.
			run("proxy/a/one", "r0", completed, t0.Add(30*time.Minute), "one-closed", t0.Add(7*time.Minute), t0.Add(8*time.Minute)),
		},
	}}
	got, high, read, err := List(context.Background(), l, Query{Namespace: "ns", PageSize: 2, Query: "q"}, names)
	require.NoError(t, err)
	assert.Equal(t, 7, read)
	assert.Equal(t, t0.Add(8*time.Minute), high, "the latest change: a close time later than the memo's")
	var ids, runs, values []string
	for _, r := range got {
		ids, runs, values = append(ids, r.WorkflowID), append(runs, r.RunID), append(values, r.Value)
	}
	assert.Equal(t, []string{"proxy/a/one", "proxy/a/two", "proxy/a/three"}, ids)
	assert.Equal(t, []string{"r2", "r1", "r2"}, runs)
	assert.Equal(t, []string{"one", "two", "three"}, values)
	assert.Equal(t, t0.Add(4*time.Minute), got[0].Changed)
	require.Len(t, l.reqs, 2)
	for _, req := range l.reqs {
		assert.Equal(t, "ns", req.Namespace)
		assert.Equal(t, int32(2), req.PageSize)
		assert.Equal(t, "q", req.Query)
	}
	assert.Empty(t, l.reqs[0].NextPageToken)
	assert.Equal(t, []byte{1}, l.reqs[1].NextPageToken, "the second page asked with the first's token")
}

// TestListFails: a failed list is an error, naming what failed.
func TestListFails(t *testing.T) {
	_, _, _, err := List(context.Background(), &pages{err: errors.New("unavailable")}, Query{}, names)
	require.ErrorContains(t, err, "list workflows: unavailable")
}
