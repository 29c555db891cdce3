package gcptest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/googleapi"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
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
		{
			name: "parenthesised filter joined with OR", method: http.MethodGet,
			path:     "/compute/v1/projects/p/aggregated/instances?filter=" + url.QueryEscape(`(labels.a = "x") OR (labels.b = "y")`),
			fail:     func(*Server) {},
			wantCode: 400, wantReason: "invalid", wantDomain: "global",
		},
		{
			name: "parenthesised filter with trailing text", method: http.MethodGet,
			path:     "/compute/v1/projects/p/aggregated/instances?filter=" + url.QueryEscape(`(labels.a = "x") labels.b = "y"`),
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

// listNames runs aggregatedList with filter and returns the names it answers with, by zone.
func listNames(t *testing.T, s *Server, filter string) map[string][]string {
	t.Helper()
	path := "/compute/v1/projects/p/aggregated/instances"
	if filter != "" {
		path += "?filter=" + url.QueryEscape(filter)
	}
	resp, raw := do(t, s, http.MethodGet, path, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	var body struct {
		Items map[string]struct {
			Instances []struct {
				Name string `json:"name"`
			} `json:"instances"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal(raw, &body))
	out := map[string][]string{}
	for scope, list := range body.Items {
		for _, inst := range list.Instances {
			out[scope] = append(out[scope], inst.Name)
		}
	}
	return out
}

func TestAggregatedListFilters(t *testing.T) {
	s := NewServer(t)
	add := func(zone, name string, labels map[string]string) {
		s.AddInstance("p", zone, &computepb.Instance{Name: proto.String(name), Labels: labels})
	}
	add("zone-a", "px-1", map[string]string{"inst": "prod", "uid": "u1"})
	add("zone-b", "px-2", map[string]string{"inst": "prod", "uid": "u1"})
	add("zone-a", "px-3", map[string]string{"inst": "prod", "uid": "u2"})
	add("zone-a", "px-4", map[string]string{"inst": "staging", "uid": "u1"})
	add("zone-a", "px-5", nil)
	s.AddInstance("other-project", "zone-a", &computepb.Instance{Name: proto.String("px-6"), Labels: map[string]string{"inst": "prod", "uid": "u1"}})

	tests := []struct {
		name, filter string
		want         map[string][]string
	}{
		{"none", "", map[string][]string{"zones/zone-a": {"px-1", "px-3", "px-4", "px-5"}, "zones/zone-b": {"px-2"}}},
		{"bare", `labels.inst = "prod"`, map[string][]string{"zones/zone-a": {"px-1", "px-3"}, "zones/zone-b": {"px-2"}}},
		{"one parenthesised", `(labels.inst = "staging")`, map[string][]string{"zones/zone-a": {"px-4"}}},
		{"two parenthesised are ANDed", `(labels.inst = "prod") (labels.uid = "u1")`, map[string][]string{"zones/zone-a": {"px-1"}, "zones/zone-b": {"px-2"}}},
		{"spacing is free", `  ( labels.inst="prod" )(labels.uid =  "u2")  `, map[string][]string{"zones/zone-a": {"px-3"}}},
		{"a missing label never matches", `(labels.inst = "prod") (labels.team = "")`, map[string][]string{}},
		{"one key, two values", `(labels.inst = "prod") (labels.inst = "staging")`, map[string][]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, listNames(t, s, tc.filter))
		})
	}
}

// Filters records what each list asked the server for, so tests can prove a list was
// narrowed by the server and not read whole; other methods record none.
func TestFiltersAreRecorded(t *testing.T) {
	s := NewServer(t)
	listNames(t, s, `(labels.inst = "prod") (labels.uid = "u1")`)
	listNames(t, s, "")
	do(t, s, http.MethodGet, "/compute/v1/projects/p/global/firewalls?filter="+url.QueryEscape(`description eq "proxyfleet: .*"`), "")
	do(t, s, http.MethodGet, "/compute/v1/projects/p/zones/z/instances/px-a", "")
	assert.Equal(t, []string{`(labels.inst = "prod") (labels.uid = "u1")`, ""}, s.Filters(MethodAggregatedList))
	assert.Equal(t, []string{`description eq "proxyfleet: .*"`}, s.Filters(MethodFirewallList))
	assert.Empty(t, s.Filters(MethodGet))
}

func TestRemoveFirewall(t *testing.T) {
	s := NewServer(t)
	s.AddFirewall("p", &computepb.Firewall{Name: proto.String("px-a"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp")}}})
	s.AddFirewall("other", &computepb.Firewall{Name: proto.String("px-a"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp")}}})
	s.RemoveFirewall("p", "px-a")
	fws := s.Firewalls()
	require.Len(t, fws, 1)
	assert.Equal(t, "other", fws[0].Project)
	resp, _ := do(t, s, http.MethodGet, "/compute/v1/projects/p/global/firewalls/px-a", "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
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

// operationOf decodes an operation from a response body.
func operationOf(t *testing.T, raw []byte) *computepb.Operation {
	t.Helper()
	op := &computepb.Operation{}
	require.NoError(t, protojson.Unmarshal(raw, op), string(raw))
	return op
}

const (
	instancesPath  = "/compute/v1/projects/p/zones/z/instances"
	operationsPath = "/compute/v1/projects/p/zones/z/operations/"
)

func TestOperationsRunThenFinish(t *testing.T) {
	s := NewServer(t)
	s.HoldNextOperation(MethodInsert, 2)
	resp, raw := do(t, s, http.MethodPost, instancesPath, `{"name":"px-a"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	op := operationOf(t, raw)
	assert.Equal(t, computepb.Operation_RUNNING, op.GetStatus(), "GCE answers an insert before it is done")
	require.Len(t, s.Instances(), 1, "the instance exists while it is placed")

	for i, want := range []computepb.Operation_Status{computepb.Operation_RUNNING, computepb.Operation_RUNNING, computepb.Operation_DONE, computepb.Operation_DONE} {
		resp, raw := do(t, s, http.MethodGet, operationsPath+op.GetName(), "")
		require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
		got := operationOf(t, raw)
		assert.Equal(t, want, got.GetStatus(), "poll %d", i)
		assert.Nil(t, got.GetError())
	}
	assert.Len(t, s.Instances(), 1)

	resp, _ = do(t, s, http.MethodGet, operationsPath+"operation-404", "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestFailedInsertOperationLeavesNoInstance(t *testing.T) {
	s := NewServer(t)
	s.FailNextOperation(MethodInsert, http.StatusServiceUnavailable, "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/p/zones/z' does not have enough resources")
	resp, raw := do(t, s, http.MethodPost, instancesPath, `{"name":"px-a"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the insert itself is accepted")
	op := operationOf(t, raw)
	assert.Equal(t, computepb.Operation_RUNNING, op.GetStatus())

	_, raw = do(t, s, http.MethodGet, operationsPath+op.GetName(), "")
	done := operationOf(t, raw)
	assert.Equal(t, computepb.Operation_DONE, done.GetStatus())
	require.Len(t, done.GetError().GetErrors(), 1)
	assert.Equal(t, "ZONE_RESOURCE_POOL_EXHAUSTED", done.GetError().GetErrors()[0].GetCode())
	assert.Equal(t, int32(503), done.GetHttpErrorStatusCode())
	assert.Equal(t, "SERVICE UNAVAILABLE", done.GetHttpErrorMessage())
	assert.Empty(t, s.Instances())
	assert.Equal(t, []Operation{{Name: op.GetName(), Type: MethodInsert, Status: "DONE", ErrorCode: "ZONE_RESOURCE_POOL_EXHAUSTED"}}, s.Operations())
}

func TestRequestIDsAreRecognised(t *testing.T) {
	s := NewServer(t)
	const id = "3f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b"
	s.HoldNextOperation(MethodInsert, 1)
	_, raw := do(t, s, http.MethodPost, instancesPath+"?requestId="+id, `{"name":"px-a"}`)
	first := operationOf(t, raw)
	assert.Equal(t, id, first.GetClientOperationId())

	// The same ID: the same operation, whatever the body, and nothing done again.
	resp, raw := do(t, s, http.MethodPost, instancesPath+"?requestId="+id, `{"name":"px-b"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	assert.Equal(t, first.GetName(), operationOf(t, raw).GetName())
	assert.Len(t, s.Instances(), 1)

	// Another ID, or none: a new request, refused as GCE would.
	resp, _ = do(t, s, http.MethodPost, instancesPath+"?requestId=4f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b", `{"name":"px-a"}`)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	resp, _ = do(t, s, http.MethodPost, instancesPath, `{"name":"px-a"}`)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)

	s.ForgetRequestIDs()
	resp, _ = do(t, s, http.MethodPost, instancesPath+"?requestId="+id, `{"name":"px-a"}`)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "a forgotten ID is new")

	for _, bad := range []string{"not-a-uuid", "00000000-0000-0000-0000-000000000000"} {
		resp, raw := do(t, s, http.MethodPost, instancesPath+"?requestId="+bad, `{"name":"px-c"}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, bad)
		assert.Contains(t, string(raw), "requestId")
	}
	assert.Equal(t, []string{id, id, "4f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b", "", id, "not-a-uuid", "00000000-0000-0000-0000-000000000000"},
		s.RequestIDs(MethodInsert))
}

func TestDeleteWhileDeleting(t *testing.T) {
	s := NewServer(t)
	s.AddInstance("p", "z", &computepb.Instance{Name: proto.String("px-a"), Status: proto.String("RUNNING")})
	s.HoldNextOperation(MethodDelete, 1)
	resp, raw := do(t, s, http.MethodDelete, instancesPath+"/px-a", "")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	op := operationOf(t, raw)
	require.Len(t, s.Instances(), 1, "a deleting VM lingers")
	assert.Equal(t, "STOPPING", s.Instances()[0].Status)

	resp, raw = do(t, s, http.MethodDelete, instancesPath+"/px-a", "")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	err := googleapi.CheckResponseWithBody(resp, raw)
	var herr *googleapi.Error
	require.ErrorAs(t, err, &herr)
	require.Len(t, herr.Errors, 1)
	assert.Equal(t, "resourceNotReady", herr.Errors[0].Reason)

	do(t, s, http.MethodGet, operationsPath+op.GetName(), "") // RUNNING
	require.Len(t, s.Instances(), 1)
	do(t, s, http.MethodGet, operationsPath+op.GetName(), "") // DONE
	assert.Empty(t, s.Instances())
}

func TestFailedDeleteOperationKeepsTheInstance(t *testing.T) {
	s := NewServer(t)
	s.AddInstance("p", "z", &computepb.Instance{Name: proto.String("px-a"), Status: proto.String("RUNNING")})
	s.FailNextOperation(MethodDelete, 0, "INTERNAL_ERROR", "Internal error")
	resp, _ := do(t, s, http.MethodDelete, instancesPath+"/px-a", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s.CompleteOperations()
	got := s.Instances()
	require.Len(t, got, 1)
	assert.Equal(t, "RUNNING", got[0].Status, "back in the status it had")
	ops := s.Operations()
	require.Len(t, ops, 1)
	assert.Equal(t, "INTERNAL_ERROR", ops[0].ErrorCode)
}

const (
	firewallsPath        = "/compute/v1/projects/p/global/firewalls"
	globalOperationsPath = "/compute/v1/projects/p/global/operations/"
)

// Firewall operations are global: polled through globalOperations, never found through a
// zone's operations, and they name no zone.
func TestFirewallOperationsAreGlobal(t *testing.T) {
	s := NewServer(t)
	s.HoldNextOperation(MethodFirewallInsert, 1)
	resp, raw := do(t, s, http.MethodPost, firewallsPath+"?requestId=3f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b",
		`{"name":"px-a","sourceRanges":["203.0.113.0/24"],"allowed":[{"IPProtocol":"tcp","ports":["3128"]}],"targetTags":["px-a"]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	op := operationOf(t, raw)
	assert.Equal(t, computepb.Operation_RUNNING, op.GetStatus())
	assert.Equal(t, "insert", op.GetOperationType())
	assert.Empty(t, op.GetZone())
	assert.Contains(t, op.GetSelfLink(), "/global/operations/")

	resp, _ = do(t, s, http.MethodGet, operationsPath+op.GetName(), "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a zone's operations do not hold a global one")
	for _, want := range []computepb.Operation_Status{computepb.Operation_RUNNING, computepb.Operation_DONE} {
		_, raw := do(t, s, http.MethodGet, globalOperationsPath+op.GetName(), "")
		assert.Equal(t, want, operationOf(t, raw).GetStatus())
	}
	assert.Equal(t, []Operation{{Name: op.GetName(), Type: "insert", Status: "DONE", Global: true}}, s.Operations())

	// An instance's operation is not found among the global ones either.
	_, raw = do(t, s, http.MethodPost, instancesPath, `{"name":"px-a"}`)
	resp, _ = do(t, s, http.MethodGet, globalOperationsPath+operationOf(t, raw).GetName(), "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	// The same request ID: the same operation.
	_, raw = do(t, s, http.MethodPost, firewallsPath+"?requestId=3f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b", `{"name":"px-b","allowed":[{"IPProtocol":"tcp"}]}`)
	assert.Equal(t, op.GetName(), operationOf(t, raw).GetName())
	assert.Len(t, s.Firewalls(), 1)
}

func TestFirewallLifecycle(t *testing.T) {
	s := NewServer(t)
	body := `{"name":"px-a","description":"d","network":"global/networks/crawl","sourceRanges":["203.0.113.0/24"],` +
		`"allowed":[{"IPProtocol":"tcp","ports":["3128"]}],"targetTags":["px-a"]}`
	resp, raw := do(t, s, http.MethodPost, firewallsPath, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	resp, _ = do(t, s, http.MethodPost, firewallsPath, body)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)

	got := s.Firewalls()
	require.Len(t, got, 1)
	assert.Equal(t, s.URL+"/compute/v1/projects/p/global/networks/crawl", got[0].Network, "GCE answers with URLs")
	assert.Equal(t, "INGRESS", got[0].Direction)
	assert.Equal(t, int32(1000), got[0].Priority)
	assert.Equal(t, []string{"tcp:3128"}, got[0].Allowed)

	resp, raw = do(t, s, http.MethodGet, firewallsPath+"/px-a", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(raw), `"creationTimestamp"`)

	// Update replaces the whole rule once its operation is done; the network cannot move.
	resp, _ = do(t, s, http.MethodPut, firewallsPath+"/px-a", `{"name":"px-a","network":"global/networks/other","allowed":[{"IPProtocol":"tcp"}]}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	s.HoldNextOperation(MethodFirewallUpdate, 1)
	resp, raw = do(t, s, http.MethodPut, firewallsPath+"/px-a",
		`{"name":"px-a","network":"projects/p/global/networks/crawl","sourceRanges":["198.51.100.0/24"],"allowed":[{"IPProtocol":"tcp","ports":["8080"]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	update := operationOf(t, raw)
	assert.Equal(t, "update", update.GetOperationType())
	assert.Equal(t, []string{"203.0.113.0/24"}, s.Firewalls()[0].SourceRanges, "not before the operation is done")
	resp, _ = do(t, s, http.MethodDelete, firewallsPath+"/px-a", "")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "busy with the update")
	s.CompleteOperations()
	got = s.Firewalls()
	assert.Equal(t, []string{"198.51.100.0/24"}, got[0].SourceRanges)
	assert.Equal(t, []string{"tcp:8080"}, got[0].Allowed)
	assert.Empty(t, got[0].TargetTags, "left out, so cleared")
	assert.Empty(t, got[0].Description)

	resp, _ = do(t, s, http.MethodDelete, firewallsPath+"/px-a", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, s.Firewalls())
	resp, _ = do(t, s, http.MethodGet, firewallsPath+"/px-a", "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = do(t, s, http.MethodDelete, firewallsPath+"/px-a", "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestFirewallInsertIsValidated(t *testing.T) {
	for name, body := range map[string]string{
		"bad name":                   `{"name":"PX","allowed":[{"IPProtocol":"tcp"}]}`,
		"bad range":                  `{"name":"px-a","sourceRanges":["crawlers"],"allowed":[{"IPProtocol":"tcp"}]}`,
		"IPv4 and IPv6 ranges":       `{"name":"px-a","sourceRanges":["203.0.113.0/24","2001:db8::/32"],"allowed":[{"IPProtocol":"tcp"}]}`,
		"neither allowed nor denied": `{"name":"px-a","sourceRanges":["203.0.113.0/24"]}`,
		"unknown field":              `{"name":"px-a","allowed":[{"IPProtocol":"tcp"}],"labels":{"a":"b"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			s := NewServer(t)
			resp, _ := do(t, s, http.MethodPost, firewallsPath, body)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			assert.Empty(t, s.Firewalls())
		})
	}
}

func TestFirewallListFilters(t *testing.T) {
	s := NewServer(t)
	for _, fw := range []*computepb.Firewall{
		{Name: proto.String("px-a"), Description: proto.String("proxyfleet: x; zone=a")},
		{Name: proto.String("px-b"), Description: proto.String("proxyfleet: x; zone=b")},
		{Name: proto.String("allow-ssh"), Description: proto.String("ssh for admins")},
		{Name: proto.String("bare")},
	} {
		fw.Allowed = []*computepb.Allowed{{IPProtocol: proto.String("tcp")}}
		s.AddFirewall("p", fw)
	}
	s.AddFirewall("other", &computepb.Firewall{Name: proto.String("px-c"), Description: proto.String("proxyfleet: x")})

	list := func(filter string) (int, []string) {
		path := firewallsPath
		if filter != "" {
			path += "?filter=" + url.QueryEscape(filter)
		}
		resp, raw := do(t, s, http.MethodGet, path, "")
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, nil
		}
		l := &computepb.FirewallList{}
		require.NoError(t, protojson.Unmarshal(raw, l))
		var names []string
		for _, fw := range l.GetItems() {
			names = append(names, fw.GetName())
		}
		return resp.StatusCode, names
	}
	_, names := list("")
	assert.Equal(t, []string{"allow-ssh", "bare", "px-a", "px-b"}, names)
	_, names = list(`description eq "proxyfleet: .*"`)
	assert.Equal(t, []string{"px-a", "px-b"}, names)
	_, names = list(`description eq "proxyfleet: x"`)
	assert.Empty(t, names, "the expression must match the whole field")
	_, names = list(`name eq "px-.*"`)
	assert.Equal(t, []string{"px-a", "px-b"}, names)
	code, _ := list(`description = "proxyfleet"`)
	assert.Equal(t, http.StatusBadRequest, code, "forms the fake does not know are refused")
}

func TestInstancesGetAnInternalAddress(t *testing.T) {
	s := NewServer(t)
	resp, raw := do(t, s, http.MethodPost, instancesPath, `{"name":"px-a","networkInterfaces":[{}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	got := s.Instances()
	require.Len(t, got, 1)
	assert.Regexp(t, `^10\.128\.\d+\.\d+$`, got[0].NetworkIP)
	assert.Empty(t, got[0].NatIP)

	s.RemoveInstance("p", "z", "px-a")
	assert.Empty(t, s.Instances())
}

// TestSpotSchedulingIsValidated: as GCE, a Spot VM that would restart by itself or
// live-migrate is refused; a valid one is accepted.
func TestSpotSchedulingIsValidated(t *testing.T) {
	s := NewServer(t)
	const path = "/compute/v1/projects/p/zones/europe-west1-b/instances"
	resp, raw := do(t, s, http.MethodPost, path, `{"name":"px-a","scheduling":{"provisioningModel":"SPOT","automaticRestart":true}}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, string(raw))
	resp, raw = do(t, s, http.MethodPost, path, `{"name":"px-b","scheduling":{"provisioningModel":"SPOT","onHostMaintenance":"MIGRATE","automaticRestart":false}}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, string(raw))
	resp, raw = do(t, s, http.MethodPost, path, `{"name":"px-c","scheduling":{"provisioningModel":"SPOT","onHostMaintenance":"TERMINATE","automaticRestart":false,"instanceTerminationAction":"STOP"}}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	require.Len(t, s.Instances(), 1)
}
