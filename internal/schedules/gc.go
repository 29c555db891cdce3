// Package schedules creates the Temporal Schedules the worker relies on, idempotently, at
// worker start: creating when absent, updating spec and action when present, and leaving a
// schedule an operator paused paused.
package schedules

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// GCOptions configure the "proxy-gc" schedule.
type GCOptions struct {
	// Every is the sweep interval (0: workflows.DefaultGCInterval).
	Every     time.Duration
	TaskQueue string
	Input     workflows.GCInput
}

// EnsureGC creates or updates the "proxy-gc" schedule. Overlapping runs are skipped, so two
// triggers at once give one sweep.
func EnsureGC(ctx context.Context, sc client.ScheduleClient, opts GCOptions) error {
	if opts.Every <= 0 {
		opts.Every = workflows.DefaultGCInterval
	}
	if opts.TaskQueue == "" {
		opts.TaskQueue = contract.TaskQueue
	}
	spec := client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: opts.Every}}}
	action := &client.ScheduleWorkflowAction{
		ID:                       contract.GCWorkflowID,
		Workflow:                 contract.GCWorkflowType,
		Args:                     []any{opts.Input},
		TaskQueue:                opts.TaskQueue,
		WorkflowExecutionTimeout: 30 * time.Minute,
		StaticSummary:            fmt.Sprintf("Orphan sweep of installation %s", opts.Input.Installation),
	}
	_, err := sc.Create(ctx, client.ScheduleOptions{
		ID:      contract.GCScheduleID,
		Spec:    spec,
		Action:  action,
		Overlap: enums.SCHEDULE_OVERLAP_POLICY_SKIP,
		Note:    "created by the proxyfleet worker; pause it here to stop orphan sweeps",
	})
	if !errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		return err
	}
	return sc.GetHandle(ctx, contract.GCScheduleID).Update(ctx, client.ScheduleUpdateOptions{
		DoUpdate: func(in client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
			s := in.Description.Schedule
			s.Spec = &spec
			s.Action = action
			if s.Policy == nil {
				s.Policy = &client.SchedulePolicies{}
			}
			s.Policy.Overlap = enums.SCHEDULE_OVERLAP_POLICY_SKIP
			return &client.ScheduleUpdate{Schedule: &s}, nil
		},
	})
}
