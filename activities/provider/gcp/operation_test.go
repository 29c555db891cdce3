package gcp

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
)

// testRef is where gcpRequest("px-a", minimalSpec()) puts its instance, for testUID.
var (
	testRef = ref{project: testProject, zone: "europe-west1-b", name: "px-a"}
	testUID = gcpRequest("px-a", minimalSpec()).ProxyUID
)

func TestCreateWaitsForTheInsertOperation(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.HoldNextOperation(gcptest.MethodInsert, 3)

	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	assert.Equal(t, provider.StateProvisioning, inst.State)
	assert.Equal(t, 4, srv.Requests(gcptest.MethodGetOperation), "three RUNNING answers, then DONE")
	ops := instanceOperations(srv)
	require.Len(t, ops, 1)
	assert.Equal(t, "DONE", ops[0].Status)
}

// A stockout or quota refusal is reported only inside the operation of an insert GCE had
// accepted; it must reach the workflow exactly as a direct refusal of the same reason would.
func TestCreateReportsOperationErrors(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		code, msg  string
		polls      int
		want       provider.Kind
		wantInText string
	}{
		{"stockout", 503, "ZONE_RESOURCE_POOL_EXHAUSTED",
			"The zone 'projects/proj-a/zones/europe-west1-b' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.",
			2, provider.KindQuota, ""},
		{"stockout with details", 503, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
			"The zone 'projects/proj-a/zones/europe-west1-b' does not have enough resources available to fulfill the request.  '(resource type:compute)'.",
			0, provider.KindQuota, ""},
		{"regional stockout", 503, "REGION_RESOURCE_POOL_EXHAUSTED", "The region does not have enough resources", 0, provider.KindQuota, ""},
		{"resource pool", 503, "RESOURCE_POOL_EXHAUSTED", "No resources", 0, provider.KindQuota, ""},
		{"quota", 403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.", 1, provider.KindQuota, "CPUS"},
		{"subnet full", 400, "IP_SPACE_EXHAUSTED", "IP space of 'projects/proj-a/regions/europe-west1/subnetworks/s' is exhausted", 0, provider.KindQuota, ""},
		{"image not found", 404, "RESOURCE_NOT_FOUND", "The resource 'projects/debian-cloud/global/images/family/debian-99' was not found", 0, provider.KindPermanent, "debian-99"},
		{"invalid machine type", 400, "INVALID_FIELD_VALUE", "Invalid value for field 'resource.machineType': 'e2-nope'", 1, provider.KindPermanent, "e2-nope"},
		{"permission", 403, "PERMISSIONS_ERROR", "Required 'compute.subnetworks.use' permission for 'projects/proj-a/regions/europe-west1/subnetworks/s'", 0, provider.KindPermanent, ""},
		{"operation rate", 403, "RESOURCE_OPERATION_RATE_EXCEEDED", "Too frequent operations from the source resource.", 0, provider.KindTransient, ""},
		{"internal", 500, "INTERNAL_ERROR", "Internal error. Please try again or contact Google Support.", 0, provider.KindTransient, ""},
		// An unknown code is transient even with a 4xx status: a wrong permanent verdict
		// parks the Proxy as Failed.
		{"unknown code", 400, "UNSUPPORTED_OPERATION", "The instance was preempted while being created", 0, provider.KindTransient, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			srv.NextOperation(gcptest.MethodInsert, gcptest.Outcome{
				RunningPolls: tc.polls, ErrorCode: tc.code, ErrorMessage: tc.msg, HTTPStatus: tc.status,
			})
			_, err := p.Create(t.Context(), gcpRequest("px-a", minimalSpec()))
			require.Error(t, err)
			assert.Equal(t, tc.want, provider.Class(err), err.Error())
			assert.Contains(t, err.Error(), tc.code)
			assert.Contains(t, err.Error(), "zone europe-west1-b", "the message names the zone")
			assert.Contains(t, err.Error(), tc.wantInText)
			assert.NotErrorIs(t, err, provider.ErrNotFound)
			assert.Empty(t, srv.Instances(), "a failed insert leaves no instance")
			assert.Equal(t, 1, srv.Requests(gcptest.MethodInsert))
			assert.Equal(t, tc.polls+1, srv.Requests(gcptest.MethodGetOperation))
		})
	}
}

func TestCreateNeverReturnsTheCloudInitFromAnOperation(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho 'proxy_password=hunter2' > /etc/squid/passwd\n")
	srv.FailNextOperation(gcptest.MethodInsert, 400, "INVALID_FIELD_VALUE",
		"Invalid value for field 'resource.metadata': "+string(req.CloudInit))

	_, err := p.Create(t.Context(), req)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// The activity bounds Create; an operation still running then is a transient error, and
// the retry, sending the same request ID, is answered with the same operation.
func TestCreateGivesUpWaitingWhenCtxEnds(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.HoldNextOperation(gcptest.MethodInsert, 1_000_000)
	req := gcpRequest("px-a", minimalSpec())

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Create(ctx, req)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second, "the wait ends with ctx")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, provider.KindTransient, provider.Class(err))
	assert.Contains(t, err.Error(), "still running")

	// Still running: the retry waits on the same operation, without a second insert.
	ctx2, cancel2 := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel2()
	_, err = p.Create(ctx2, req)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	srv.CompleteOperations()
	inst := create(t, p, req)
	assert.Equal(t, "px-a", inst.Name)
	ids := srv.RequestIDs(gcptest.MethodInsert)
	require.Len(t, ids, 3)
	assert.Equal(t, requestID(callInsert, testRef, testUID+" key 0a1b2c3d"), ids[0])
	assert.Equal(t, []string{ids[0], ids[0], ids[0]}, ids, "every retry sends the same request ID")
	assert.Len(t, instanceOperations(srv), 1, "GCE recognised the retries: one operation")
	assert.Len(t, srv.Instances(), 1)
}

// After a stockout, the retry must be a new attempt: under the first request ID GCE would
// only answer with the failed operation, for an hour or more.
func TestCreateAfterAFailedOperationTriesAgain(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	srv.FailNextOperation(gcptest.MethodInsert, 503, "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources")
	srv.FailNextOperation(gcptest.MethodInsert, 403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.")

	_, err := p.Create(t.Context(), req)
	require.Error(t, err)
	assert.Equal(t, provider.KindQuota, provider.Class(err))
	assert.Contains(t, err.Error(), "ZONE_RESOURCE_POOL_EXHAUSTED")

	_, err = p.Create(t.Context(), req)
	require.Error(t, err)
	assert.Equal(t, provider.KindQuota, provider.Class(err))
	assert.Contains(t, err.Error(), "QUOTA_EXCEEDED", "the second attempt really ran, and failed its own way")

	inst := create(t, p, req)
	assert.Equal(t, "px-a", inst.Name)
	again := create(t, p, req) // a retry after success walks the same IDs and adopts
	assert.Equal(t, inst.ProviderID, again.ProviderID)

	ids := srv.RequestIDs(gcptest.MethodInsert)
	require.Len(t, ids, 1+2+3+3)
	id0, id1, id2 := ids[0], ids[2], ids[5]
	assert.Equal(t, []string{id0, id0, id1, id0, id1, id2, id0, id1, id2}, ids)
	assert.NotEqual(t, id0, id1)
	assert.NotEqual(t, id1, id2)
	ops := instanceOperations(srv)
	require.Len(t, ops, 3, "three real attempts")
	assert.Equal(t, "ZONE_RESOURCE_POOL_EXHAUSTED", ops[0].ErrorCode)
	assert.Equal(t, "QUOTA_EXCEEDED", ops[1].ErrorCode)
	assert.Empty(t, ops[2].ErrorCode)
	assert.Len(t, srv.Instances(), 1)
}

// An instance name used again after its instance was deleted (a Proxy whose state was
// lost counts from its instances still there) needs requests GCE has not seen.
func TestANameUsedAgainGetsNewRequestIDs(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	inst := create(t, p, req)
	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	srv.CompleteOperations()
	require.Empty(t, srv.Instances())

	again := create(t, p, req)
	assert.Len(t, srv.Instances(), 1, "the old insert's operation did not stand in for a new one")
	require.NoError(t, p.Delete(t.Context(), again.ProviderID))
	assert.Empty(t, srv.Instances(), "the old delete's operation did not stand in for a new one")

	// Each second call sent the old ID, was answered with the old, finished operation, and
	// moved on to an ID of its own.
	for _, method := range []string{gcptest.MethodInsert, gcptest.MethodDelete} {
		ids := srv.RequestIDs(method)
		require.Len(t, ids, 3, method)
		assert.Equal(t, ids[0], ids[1], method)
		assert.NotEqual(t, ids[1], ids[2], method)
	}
}

// Another Proxy's insert of a name that is taken (a collision) must be refused even while
// the first Proxy's insert is still running: it is not that insert's retry.
func TestCreateRefusesANameOwnedByAnotherProxyWhileItIsInserted(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.HoldNextOperation(gcptest.MethodInsert, 1_000_000)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := p.Create(ctx, gcpRequest("px-a", minimalSpec()))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Without a firewall rule, so that the instance's own check answers (the rule's is
	// TestCreateRefusesAnotherOwnersRule's).
	other := gcpRequest("px-a", internalSpec())
	other.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	ctx2, cancel2 := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel2()
	_, err = p.Create(ctx2, other)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err), err.Error())
	assert.Contains(t, err.Error(), "not this Proxy")
}

// A retried call carries the same request ID, derived from the instance and the call.
func TestRequestIDs(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))

	assert.Equal(t, []string{requestID(callInsert, testRef, testUID+" key 0a1b2c3d")}, srv.RequestIDs(gcptest.MethodInsert))
	assert.Equal(t, []string{requestID(callDelete, testRef, ""), requestID(callDelete, testRef, "")}, srv.RequestIDs(gcptest.MethodDelete))

	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]string{}
	for _, tc := range []struct {
		c   call
		r   ref
		uid string
	}{
		{callInsert, testRef, testUID},
		{callInsert, testRef, "ffffffff-0000-0000-0000-000000000000"},
		{callDelete, testRef, ""},
		{callInsert, ref{project: "proj-b", zone: testRef.zone, name: testRef.name}, testUID},
		{callInsert, ref{project: testProject, zone: "us-central1-a", name: testRef.name}, testUID},
		{callInsert, ref{project: testProject, zone: testRef.zone, name: "px-b"}, testUID},
	} {
		id := requestID(tc.c, tc.r, tc.uid)
		assert.Equal(t, id, requestID(tc.c, tc.r, tc.uid), "stable")
		assert.Regexp(t, uuid4, id)
		what := fmt.Sprintf("%s %s %s", tc.c, tc.r, tc.uid)
		assert.NotContains(t, seen, id, "%s collides with %s", what, seen[id])
		seen[id] = what
	}
	op := &computepb.Operation{Name: proto.String("operation-1"), Id: proto.Uint64(1)}
	next := nextRequestID(requestID(callInsert, testRef, testUID+" key 0a1b2c3d"), op)
	assert.Regexp(t, uuid4, next)
	assert.NotContains(t, seen, next)
	assert.Equal(t, next, nextRequestID(requestID(callInsert, testRef, testUID+" key 0a1b2c3d"), op), "stable")
}

func TestDeleteRetryIsRecognised(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.HoldNextOperation(gcptest.MethodDelete, 1)

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err, "a deleting VM lingers in STOPPING")
	assert.Equal(t, provider.StateStopped, got.State)

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	ids := srv.RequestIDs(gcptest.MethodDelete)
	require.Len(t, ids, 2)
	assert.Equal(t, ids[0], ids[1])
	assert.Len(t, instanceOperations(srv), 2, "the insert's and one delete's")

	srv.CompleteOperations()
	_, err = p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
}

// A delete GCE does not recognise as a retry (its request ID forgotten, or the first delete
// made by someone else) is refused with resourceNotReady while the first one runs; that is
// a delete in progress, not an error.
func TestDeleteWhileADeleteRuns(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.HoldNextOperation(gcptest.MethodDelete, 5)
	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	srv.ForgetRequestIDs()

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	assert.Equal(t, 2, srv.Requests(gcptest.MethodDelete))
	assert.Len(t, instanceOperations(srv), 2, "the second delete was refused, not accepted")

	srv.CompleteOperations()
	_, err := p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound, "the caller's polling sees the first delete finish")
}

func TestDeleteAfterAFailedDeleteTriesAgain(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.FailNextOperation(gcptest.MethodDelete, 500, "INTERNAL_ERROR", "Internal error")
	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	srv.CompleteOperations()
	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err, "the failed delete left the VM")
	assert.Equal(t, provider.StateProvisioning, got.State, "in the status it had")

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	_, err = p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	ids := srv.RequestIDs(gcptest.MethodDelete)
	require.Len(t, ids, 3)
	assert.Equal(t, ids[0], ids[1], "sent again, it was recognised as the failed delete")
	assert.NotEqual(t, ids[1], ids[2], "so the next attempt has a new ID")
}

// Polling the operation is a refinement: a worker that cannot read operations still
// creates, and reports the instance as Get sees it.
func TestCreateWhenTheOperationCannotBeRead(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodGetOperation, http.StatusForbidden, "forbidden", "Required 'compute.zoneOperations.get' permission")

	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	assert.Equal(t, provider.StateProvisioning, inst.State)
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGet))
}

// A reason means the same in an operation's errors[].code as in a direct error.
func TestOperationAndDirectErrorsAgree(t *testing.T) {
	var reasons []string
	for _, list := range [][]string{rateLimitReasons, quotaReasons, busyReasons} {
		reasons = append(reasons, list...)
	}
	for _, reason := range reasons {
		op := &computepb.Operation{Name: proto.String("operation-1"), Error: &computepb.Error{Errors: []*computepb.Errors{{
			Code: proto.String(reason), Message: proto.String("refused"),
		}}}}
		for _, status := range []int{400, 403, 503} {
			direct := classify(callInsert, apiErr(t, status, reason, "refused"))
			assert.Equal(t, provider.Class(direct), provider.Class(classifyOperation(op, "z")), "%s with %d", reason, status)
		}
	}
	for _, code := range permanentOperationCodes {
		op := &computepb.Operation{Error: &computepb.Error{Errors: []*computepb.Errors{{Code: proto.String(code)}}}}
		assert.Equal(t, provider.KindPermanent, provider.Class(classifyOperation(op, "z")), code)
	}
}

func TestClassifyOperationDetails(t *testing.T) {
	withDetail := func(d *computepb.ErrorDetails) *computepb.Operation {
		return &computepb.Operation{Error: &computepb.Error{Errors: []*computepb.Errors{{
			Code: proto.String("SOMETHING_NEW"), Message: proto.String("m"), ErrorDetails: []*computepb.ErrorDetails{d},
		}}}}
	}
	assert.NoError(t, classifyOperation(&computepb.Operation{}, "z"))
	assert.Equal(t, provider.KindTransient, provider.Class(classifyOperation(withDetail(&computepb.ErrorDetails{}), "z")))
	assert.Equal(t, provider.KindQuota, provider.Class(classifyOperation(withDetail(&computepb.ErrorDetails{
		QuotaInfo: &computepb.QuotaExceededInfo{MetricName: proto.String("compute.googleapis.com/cpus")},
	}), "z")))
	assert.Equal(t, provider.KindQuota, provider.Class(classifyOperation(withDetail(&computepb.ErrorDetails{
		ErrorInfo: &computepb.ErrorInfo{Reason: proto.String("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")},
	}), "z")))
	err := classifyOperation(&computepb.Operation{Name: proto.String("operation-7"), Error: &computepb.Error{Errors: []*computepb.Errors{
		{Code: proto.String("A"), Message: proto.String("first")}, {Code: proto.String("B"), Message: proto.String("second")},
	}}}, zoneScope("us-central1-a"))
	assert.Equal(t, "operation operation-7 failed in zone us-central1-a: A: first; B: second", err.Error())
	assert.True(t, strings.HasPrefix(err.Error(), "operation operation-7"))
}
