package gcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"testing"

	"github.com/googleapis/gax-go/v2/apierror"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/googleapi"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// apiErr builds the error the REST client returns for a Google error body: a
// googleapi.Error wrapped in an apierror.APIError by gax's invoke loop.
func apiErr(t *testing.T, code int, reason, message string, details ...map[string]any) error {
	t.Helper()
	body := map[string]any{"error": map[string]any{
		"code": code, "message": message,
		"errors": []map[string]any{{"domain": "global", "reason": reason, "message": message}},
	}}
	herr := &googleapi.Error{Code: code, Message: message}
	if reason != "" {
		herr.Errors = []googleapi.ErrorItem{{Reason: reason, Message: message}}
	}
	for _, d := range details {
		herr.Details = append(herr.Details, d)
	}
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	herr.Body = string(raw)
	aerr, ok := apierror.FromError(herr)
	require.True(t, ok)
	return aerr
}

func TestClassify(t *testing.T) {
	quotaInfo := map[string]any{
		"@type":  "type.googleapis.com/google.rpc.ErrorInfo",
		"reason": "QUOTA_EXCEEDED", "domain": "compute.googleapis.com",
	}
	quotaFailure := map[string]any{
		"@type":      "type.googleapis.com/google.rpc.QuotaFailure",
		"violations": []any{map[string]any{"subject": "CPUS"}},
	}
	tests := []struct {
		name         string
		call         call
		err          error
		wantKind     provider.Kind
		wantNotFound bool
	}{
		{name: "403 quotaExceeded", call: callInsert,
			err:      apiErr(t, 403, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1."),
			wantKind: provider.KindQuota},
		{name: "403 QUOTA_EXCEEDED in ErrorInfo only", call: callInsert,
			err:      apiErr(t, 403, "", "Insufficient capacity", quotaInfo),
			wantKind: provider.KindQuota},
		{name: "403 QuotaFailure detail", call: callInsert,
			err:      apiErr(t, 403, "forbidden", "denied", quotaFailure),
			wantKind: provider.KindQuota},
		{name: "403 message mentions quota", call: callInsert,
			err:      apiErr(t, 403, "forbidden", "Quota 'IN_USE_ADDRESSES' exceeded"),
			wantKind: provider.KindQuota},
		{name: "403 rateLimitExceeded is a rate limit, not a quota", call: callInsert,
			err:      apiErr(t, 403, "rateLimitExceeded", "Rate Limit Exceeded: quota per minute"),
			wantKind: provider.KindTransient},
		{name: "403 userRateLimitExceeded", call: callGet,
			err:      apiErr(t, 403, "userRateLimitExceeded", "User Rate Limit Exceeded"),
			wantKind: provider.KindTransient},
		{name: "429 mentioning quota", call: callInsert,
			err:      apiErr(t, 429, "rateLimitExceeded", "Quota exceeded for quota metric 'Queries' per minute"),
			wantKind: provider.KindTransient},
		{name: "429 without reason", call: callList,
			err:      apiErr(t, 429, "", "Too Many Requests"),
			wantKind: provider.KindTransient},
		{name: "403 forbidden", call: callInsert,
			err:      apiErr(t, 403, "forbidden", "Required 'compute.instances.create' permission"),
			wantKind: provider.KindPermanent},
		{name: "400 invalid", call: callInsert,
			err:      apiErr(t, 400, "invalid", "Invalid value for field 'resource.name'"),
			wantKind: provider.KindPermanent},
		{name: "400 resourceNotReady is a wait", call: callDelete,
			err:      apiErr(t, 400, "resourceNotReady", "The resource is not ready"),
			wantKind: provider.KindTransient},
		{name: "404 on insert names a missing zone, image or network", call: callInsert,
			err:      apiErr(t, 404, "notFound", "The resource 'projects/p/global/images/nope' was not found"),
			wantKind: provider.KindPermanent},
		{name: "404 on list is a missing project", call: callList,
			err:      apiErr(t, 404, "notFound", "The resource 'projects/nope' was not found"),
			wantKind: provider.KindPermanent},
		{name: "404 on get", call: callGet,
			err:      apiErr(t, 404, "notFound", "not found"),
			wantKind: provider.KindTransient, wantNotFound: true},
		{name: "404 on delete", call: callDelete,
			err:      apiErr(t, 404, "notFound", "not found"),
			wantKind: provider.KindTransient, wantNotFound: true},
		{name: "401 is the worker's credentials", call: callGet,
			err:      apiErr(t, 401, "authError", "Invalid Credentials"),
			wantKind: provider.KindTransient},
		{name: "409 outside insert", call: callDelete,
			err:      apiErr(t, 409, "conflict", "operation in progress"),
			wantKind: provider.KindTransient},
		{name: "500", call: callInsert,
			err:      apiErr(t, 500, "backendError", "Internal error"),
			wantKind: provider.KindTransient},
		{name: "503", call: callInsert,
			err:      apiErr(t, 503, "backendError", "Service unavailable"),
			wantKind: provider.KindTransient},
		{name: "bare googleapi.Error", call: callInsert,
			err:      &googleapi.Error{Code: 400, Message: "bad"},
			wantKind: provider.KindPermanent},
		{name: "network error", call: callInsert,
			err:      &url.Error{Op: "Post", URL: "http://127.0.0.1:1", Err: io.ErrUnexpectedEOF},
			wantKind: provider.KindTransient},
		{name: "deadline", call: callGet,
			err:      fmt.Errorf("call: %w", context.DeadlineExceeded),
			wantKind: provider.KindTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.call, tc.err)
			require.Error(t, got)
			assert.Equal(t, tc.wantKind, provider.Class(got))
			assert.Equal(t, tc.wantNotFound, errors.Is(got, provider.ErrNotFound))
			assert.ErrorIs(t, got, tc.err, "the original error stays reachable")
		})
	}

	t.Run("nil", func(t *testing.T) {
		assert.NoError(t, classify(callInsert, nil))
	})
}

func TestRedact(t *testing.T) {
	secret := []byte("#!/bin/sh\necho password=hunter2\n")
	for _, format := range []string{"%s", "%q"} {
		leaky := provider.Permanent(fmt.Errorf("gcp insert: metadata value "+format+" too long", secret))
		got := redact(leaky, secret)
		assert.NotContains(t, got.Error(), "hunter2", format)
		assert.Equal(t, provider.KindPermanent, provider.Class(got), "redaction keeps the class")
	}

	clean := provider.QuotaError(errors.New("quota"))
	assert.Same(t, clean, redact(clean, secret))
	assert.Same(t, clean, redact(clean, nil))
	assert.NoError(t, redact(nil, secret))

	// Any of several secrets: the startup script, then the cloud-init data.
	script := []byte("#!/bin/bash\nput /etc/squid/passwd <<'EOF'\ncHJveHlmbGVldDokMSRzYWx0JGhhc2gK\nEOF\n")
	leaky := fmt.Errorf("gcp insert: metadata %q refused", "cHJveHlmbGVldDokMSRzYWx0JGhhc2gK")
	got := redact(leaky, script, secret)
	assert.NotContains(t, got.Error(), "cHJveHlmbGVldDokMSRzYWx0JGhhc2gK")
	got = redact(fmt.Errorf("echo password=hunter2"), script, secret)
	assert.NotContains(t, got.Error(), "hunter2")
	assert.Same(t, clean, redact(clean, script, secret))
}
