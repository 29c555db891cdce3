package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/googleapi"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// call names the API call an error came from: what a 404 means depends on it.
type call string

const (
	callInsert call = "insert"
	callGet    call = "get"
	callDelete call = "delete"
	callList   call = "aggregatedList"

	callFirewallInsert call = "firewalls.insert"
	callFirewallGet    call = "firewalls.get"
	callFirewallUpdate call = "firewalls.update"
	callFirewallDelete call = "firewalls.delete"
	callFirewallList   call = "firewalls.list"
)

// notFoundIsAnswer reports whether a 404 from c says the resource asked about does not
// exist. For an insert it says something the resource refers to (a zone, an image, a
// network) does not, which is the user's to fix.
func (c call) notFoundIsAnswer() bool {
	switch c {
	case callGet, callDelete, callFirewallGet, callFirewallDelete:
		return true
	default:
		return false
	}
}

// Reasons as the Compute API spells them: in the legacy errors[].reason field and the
// google.rpc.ErrorInfo detail of a direct error, and in the errors[].code field of a failed
// operation. Compared case-insensitively, because both spellings occur. A reason means the
// same wherever it appears, so an operation error and a direct error of the same reason are
// classified alike.
var (
	rateLimitReasons = []string{"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
		// Too many operations on one resource in a short time; GCE reports it as a 403.
		"RESOURCE_OPERATION_RATE_EXCEEDED"}
	// quotaReasons are refusals for want of room, which only waiting (or an operator adding
	// room) fixes: quota, and the zone running out of hardware (a stockout, which GCE
	// reports inside the insert operation once the insert itself was accepted). The
	// stockout codes are those of Compute Engine's "Troubleshoot resource availability
	// errors" page, the bulk API's insufficientCapacity, and a subnet out of addresses.
	quotaReasons = []string{"quotaExceeded", "QUOTA_EXCEEDED", "dailyLimitExceeded",
		"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
		"REGION_RESOURCE_POOL_EXHAUSTED", "RESOURCE_POOL_EXHAUSTED",
		"insufficientCapacity", "INSUFFICIENT_CAPACITY", "IP_SPACE_EXHAUSTED"}
	// busyReasons answer a request on an instance another operation is busy with
	// (resourceNotReady: a delete issued again while the first one runs): waiting fixes it.
	busyReasons = []string{"resourceNotReady", "RESOURCE_NOT_READY", "resourceInUseByAnotherResource"}
	// permanentOperationCodes are operation error codes that retrying the same insert
	// cannot fix: a machine type, image, network or subnetwork that does not exist or is
	// refused, and a missing permission. A direct error says as much with its HTTP status
	// (404, 400, 403); an operation's status is not relied on, see classifyOperation.
	permanentOperationCodes = []string{"RESOURCE_NOT_FOUND", "INVALID_FIELD_VALUE", "INVALID_USAGE",
		"PERMISSIONS_ERROR", "invalid", "notFound", "forbidden"}
)

// classify is the one place Compute API errors become the provider taxonomy. The order
// matters: a rate limit is answered 403 as often as 429 and must not fail a Proxy, and a
// quota refusal must be told apart from a plain permission denial, both being 403.
func classify(c call, err error) error {
	if err == nil {
		return nil
	}
	var herr *googleapi.Error
	if !errors.As(err, &herr) {
		// Network trouble, timeouts, cancelled contexts: nothing the user can fix.
		return err
	}
	if herr.Code == http.StatusTooManyRequests {
		// Even with a QuotaFailure detail: a 429 is a per-minute rate quota, which passes.
		return err
	}
	reasons, quotaDetail := errorReasons(err, herr)
	if kind, ok := kindByReason(reasons, quotaDetail); ok {
		return withKind(kind, err)
	}
	switch {
	case herr.Code == http.StatusForbidden && strings.Contains(strings.ToLower(herr.Message), "quota"):
		return provider.QuotaError(err)
	case herr.Code == http.StatusNotFound && c.notFoundIsAnswer():
		return fmt.Errorf("%w: %w", provider.ErrNotFound, err)
	case herr.Code >= 500:
		return err
	// 401 is the worker's credentials, 408 a slow network, 409 a concurrent operation
	// (insert's 409 is handled by Create before this): none is the Proxy's fault, and a
	// permanent error would park it as Failed until an unrelated spec change.
	case herr.Code == http.StatusUnauthorized, herr.Code == http.StatusRequestTimeout,
		herr.Code == http.StatusConflict:
		return err
	case herr.Code >= 400:
		// 400 (invalid field), 403 (permission), 404 on insert (zone, image, network or
		// machine type not found) and the rest: retrying the same request cannot succeed.
		return provider.Permanent(err)
	default:
		return err
	}
}

// kindByReason is the part of the taxonomy that reasons alone decide, shared by direct and
// operation errors: rate limits and busy resources are waits, quota and stockouts are
// quota. ok is false when no reason decides.
func kindByReason(reasons []string, quotaDetail bool) (kind provider.Kind, ok bool) {
	switch {
	case hasReason(reasons, rateLimitReasons):
		return provider.KindTransient, true
	case quotaDetail || hasReason(reasons, quotaReasons):
		return provider.KindQuota, true
	case hasReason(reasons, busyReasons):
		return provider.KindTransient, true
	default:
		return provider.KindTransient, false
	}
}

// operationError is an operation that ended with errors. Its message names the operation,
// where it ran and every error code and message, since that is all the Proxy's status will
// say about why no VM appeared.
type operationError struct {
	op *computepb.Operation
	// scope is where the operation ran: "zone <zone>" for an instance's, "global" for a
	// firewall rule's.
	scope string
}

func (e *operationError) Error() string {
	parts := make([]string, 0, len(e.op.GetError().GetErrors()))
	for _, oe := range e.op.GetError().GetErrors() {
		parts = append(parts, oe.GetCode()+": "+oe.GetMessage())
	}
	return fmt.Sprintf("operation %s failed in %s: %s", e.op.GetName(), e.scope, strings.Join(parts, "; "))
}

// classifyOperation classifies a finished operation's errors, or returns nil if it has
// none; scope says where it ran (zoneScope, or "global"). Codes are reasons by another name and are judged by the same lists as a direct
// error's (kindByReason); past those, only codes known to be permanent are, and every
// other code is transient. The operation's httpErrorStatusCode is deliberately not used
// the way a direct error's status is: GCE gives stockouts and internal failures 4xx and
// 5xx statuses inconsistently, and a wrong permanent verdict parks the Proxy as Failed.
func classifyOperation(op *computepb.Operation, scope string) error {
	errs := op.GetError().GetErrors()
	if len(errs) == 0 {
		return nil
	}
	var reasons []string
	quotaDetail := false
	for _, oe := range errs {
		reasons = append(reasons, oe.GetCode())
		for _, d := range oe.GetErrorDetails() {
			if r := d.GetErrorInfo().GetReason(); r != "" {
				reasons = append(reasons, r)
			}
			if d.GetQuotaInfo() != nil {
				quotaDetail = true
			}
		}
	}
	err := &operationError{op: op, scope: scope}
	if kind, ok := kindByReason(reasons, quotaDetail); ok {
		return withKind(kind, err)
	}
	if hasReason(reasons, permanentOperationCodes) {
		return provider.Permanent(err)
	}
	return err
}

// zoneScope is an instance operation's scope, for classifyOperation.
func zoneScope(zone string) string { return "zone " + zone }

// isNotReady reports GCE's answer to a request on an instance that another operation (a
// delete still running, an insert not finished) is busy with.
func isNotReady(err error) bool {
	var herr *googleapi.Error
	if !errors.As(err, &herr) {
		return false
	}
	reasons, _ := errorReasons(err, herr)
	return hasReason(reasons, []string{"resourceNotReady", "RESOURCE_NOT_READY"})
}

// errorReasons gathers the reasons from every place the API puts them. The ErrorInfo
// detail is read from the raw details too, because apierror gives up on bodies that also
// carry the legacy errors[] list, which Compute bodies do.
func errorReasons(err error, herr *googleapi.Error) (reasons []string, quotaDetail bool) {
	for _, item := range herr.Errors {
		reasons = append(reasons, item.Reason)
	}
	for _, d := range herr.Details {
		m, ok := d.(map[string]any)
		if !ok {
			continue
		}
		if r, ok := m["reason"].(string); ok {
			reasons = append(reasons, r)
		}
		if t, ok := m["@type"].(string); ok && strings.HasSuffix(t, "google.rpc.QuotaFailure") {
			quotaDetail = true
		}
	}
	var aerr *apierror.APIError
	if errors.As(err, &aerr) {
		if r := aerr.Reason(); r != "" {
			reasons = append(reasons, r)
		}
		if aerr.Details().QuotaFailure != nil {
			quotaDetail = true
		}
	}
	return reasons, quotaDetail
}

func hasReason(got, want []string) bool {
	for _, g := range got {
		for _, w := range want {
			if strings.EqualFold(g, w) {
				return true
			}
		}
	}
	return false
}

// isAlreadyExists reports an insert refused because the name is taken, which for a
// deterministic name usually means an earlier attempt of ours got through.
func isAlreadyExists(err error) bool {
	var herr *googleapi.Error
	return errors.As(err, &herr) && herr.Code == http.StatusConflict
}

// withKind re-marks err as kind, for errors rebuilt after classification.
func withKind(kind provider.Kind, err error) error {
	switch kind {
	case provider.KindQuota:
		return provider.QuotaError(err)
	case provider.KindPermanent:
		return provider.Permanent(err)
	default:
		return err
	}
}
