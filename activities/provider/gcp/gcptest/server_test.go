package gcptest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/googleapi"
)

// do sends a raw request, to check the wire format independently of the client library.
func do(t *testing.T, s *Server, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, s.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := s.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, raw
}

func TestServerListensOnLoopback(t *testing.T) {
	s := NewServer(t)
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", u.Hostname())
}

func TestErrorsUseGoogleShape(t *testing.T) {
	tests := []struct {
		name, method, path string
		fail               func(*Server)
		wantCode           int
		wantReason         string
		wantDomain         string
	}{
		{
			name: "injected quota", method: http.MethodGet, path: "/compute/v1/projects/p/zones/z/instances/a",
			fail:     func(s *Server) { s.FailNext(MethodGet, 403, "quotaExceeded", "Quota 'CPUS' exceeded.") },
			wantCode: 403, wantReason: "quotaExceeded", wantDomain: "usageLimits",
		},
		{
			name: "missing instance", method: http.MethodDelete, path: "/compute/v1/projects/p/zones/z/instances/a",
			fail:     func(*Server) {},
			wantCode: 404, wantReason: "notFound", wantDomain: "global",
		},
		{
			name: "unsupported filter", method: http.MethodGet,
			path:     "/compute/v1/projects/p/aggregated/instances?filter=" + url.QueryEscape(`name eq "a.*"`),
			fail:     func(*Server) {},
			wantCode: 400, wantReason: "invalid", wantDomain: "global",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(t)
			tc.fail(s)
			resp, raw := do(t, s, tc.method, tc.path, "")
			require.Equal(t, tc.wantCode, resp.StatusCode)

			err := googleapi.CheckResponseWithBody(resp, raw)
			var herr *googleapi.Error
			require.ErrorAs(t, err, &herr)
			assert.Equal(t, tc.wantCode, herr.Code)
			require.Len(t, herr.Errors, 1)
			assert.Equal(t, tc.wantReason, herr.Errors[0].Reason)

			var body struct {
				Error struct {
					Errors []struct {
						Domain string `json:"domain"`
					} `json:"errors"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(raw, &body))
			require.Len(t, body.Error.Errors, 1)
			assert.Equal(t, tc.wantDomain, body.Error.Errors[0].Domain)
		})
	}
}

func TestInsertConflictAndCounters(t *testing.T) {
	s := NewServer(t)
	const path = "/compute/v1/projects/p/zones/europe-west1-b/instances"
	body := `{"name":"px-a","machineType":"zones/europe-west1-b/machineTypes/e2-micro","labels":{"k":"v"}}`

	resp, raw := do(t, s, http.MethodPost, path, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	assert.Contains(t, string(raw), `"operationType":"insert"`)

	resp, raw = do(t, s, http.MethodPost, path, body)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Contains(t, string(raw), `"reason":"alreadyExists"`)

	resp, _ = do(t, s, http.MethodPost, path, `{"name":"px-b","notAField":1}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "unknown fields are refused, as by the real API")

	got := s.Instances()
	require.Len(t, got, 1)
	assert.Equal(t, "PROVISIONING", got[0].Status)
	assert.Equal(t, map[string]string{"k": "v"}, got[0].Labels)
	assert.Equal(t, 3, s.Requests(MethodInsert))
	assert.Equal(t, 3, s.TotalRequests())
}
