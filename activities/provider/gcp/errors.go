package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

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
)

// Reasons as the Compute API spells them, in the legacy errors[].reason field and in the
// google.rpc.ErrorInfo detail. Compared case-insensitively, because both spellings occur.
var (
	rateLimitReasons = []string{"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}
	quotaReasons     = []string{"quotaExceeded", "QUOTA_EXCEEDED", "dailyLimitExceeded"}
	// busyReasons answer a request on an instance another operation is busy with
	// (resourceNotReady: a delete issued again while the first one runs): waiting fixes it.
	busyReasons = []string{"resourceNotReady", "resourceInUseByAnotherResource"}
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
	reasons, quotaDetail := errorReasons(err, herr)
	switch {
	case herr.Code == http.StatusTooManyRequests || hasReason(reasons, rateLimitReasons):
		return err
	case quotaDetail || hasReason(reasons, quotaReasons) ||
		herr.Code == http.StatusForbidden && strings.Contains(strings.ToLower(herr.Message), "quota"):
		return provider.QuotaError(err)
	case hasReason(reasons, busyReasons):
		return err
	case herr.Code == http.StatusNotFound && (c == callGet || c == callDelete):
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
