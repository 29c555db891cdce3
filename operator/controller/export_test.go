package controller

// WorkflowRestarts exposes the restart counter to the tests of package controller_test,
// which check that a resync pass counts what it starts.
var WorkflowRestarts = workflowRestarts
