// Package gcptest is an in-memory Compute Engine REST API on 127.0.0.1, speaking just enough
// of the instances resource (insert, get, delete, aggregatedList), of the firewalls
// resource (insert, get, update, delete, list) and of zone and global operations (get) for
// the gcp provider's tests to run the real client library against it, with no network and
// no credentials.
//
// Like GCE, it answers an insert, update or delete with a running operation, which finishes
// when polled (Outcome says how: after some polls, with an error), and it recognises a
// request ID it has seen by answering with that request's operation instead of acting
// again. Instance operations are zonal and polled through zoneOperations; firewall
// operations are global and polled through globalOperations, and neither endpoint finds
// the other's operations.
package gcptest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// API methods, as FailNext, NextOperation and Requests name them.
const (
	MethodInsert         = "insert"
	MethodGet            = "get"
	MethodDelete         = "delete"
	MethodAggregatedList = "aggregatedList"
	// MethodGetOperation is zoneOperations.get, which polls an instance's operation.
	MethodGetOperation = "getOperation"

	MethodFirewallInsert = "firewalls.insert"
	MethodFirewallGet    = "firewalls.get"
	// MethodFirewallUpdate is firewalls.update (PUT), which replaces the whole rule.
	MethodFirewallUpdate = "firewalls.update"
	MethodFirewallDelete = "firewalls.delete"
	MethodFirewallList   = "firewalls.list"
	// MethodGetGlobalOperation is globalOperations.get, which polls a firewall operation.
	MethodGetGlobalOperation = "globalOperations.get"
)

// operationTypes are the operationType GCE reports for a method's operation, where it is
// not the method's own name: a firewall's insert is an "insert" like an instance's.
var operationTypes = map[string]string{
	MethodFirewallInsert: "insert",
	MethodFirewallUpdate: "update",
	MethodFirewallDelete: "delete",
}

// Server is the fake API. Its zero value is not usable; call NewServer.
type Server struct {
	// URL is the endpoint to give the client (option.WithEndpoint).
	URL string

	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	instances map[key]*computepb.Instance
	zones     map[key]bool                // every zone seen, so aggregatedList can report empty ones
	firewalls map[key]*computepb.Firewall // by project and name (zone empty)
	failures  map[string][]failure
	requests  map[string]int
	seq       uint64

	outcomes   map[string][]Outcome     // by method, for the next accepted requests
	operations map[key]*operation       // by project, zone ("" for global) and operation name
	byID       map[[2]string]*operation // by project and request ID, until forgotten
	requestIDs map[string][]string      // by method, as received
	filters    map[string][]string      // by list method, as received
	deleting   map[key]*operation       // instances whose delete operation still runs
	// firewallBusy are the rules an update or delete operation still runs on.
	firewallBusy map[key]*operation
}

type key struct{ project, zone, name string }

// Outcome says how the operation of an accepted insert, update or delete goes. The zero
// Outcome is the default: the operation is DONE at its first poll, an inserted instance or
// rule exists at once (an instance PROVISIONING), and a deleted one is gone at once. An
// update takes effect when its operation is DONE.
type Outcome struct {
	// RunningPolls is how many polls answer RUNNING before the operation is DONE. While a
	// delete runs, its instance is STOPPING, and another delete of it is refused with 400
	// resourceNotReady, as GCE does.
	RunningPolls int
	// ErrorCode, when set, makes the operation end with this error (errors[].code, such as
	// ZONE_RESOURCE_POOL_EXHAUSTED) and ErrorMessage. A failed insert's instance or rule
	// exists while the operation runs and is gone once it is DONE; a failed delete's
	// instance is back in the status it had, and its rule stays; a failed update changes
	// nothing.
	ErrorCode, ErrorMessage string
	// HTTPStatus is the failed operation's httpErrorStatusCode; 400 when unset.
	HTTPStatus int
}

// operation is one insert's or delete's operation and what finishing it does.
type operation struct {
	proto     *computepb.Operation
	outcome   Outcome
	pollsLeft int
	finish    func(failed bool) // applies the operation's effect on the instances
}

type failure struct {
	code            int
	reason, message string
}

// Instance is a snapshot of one stored instance.
type Instance struct {
	Project, Zone, Name string
	Status              string
	NatIP               string
	// NetworkIP is the first interface's internal address, which the fake, like GCE,
	// gives every interface at insert.
	NetworkIP   string
	MachineType string
	Labels      map[string]string
	// Metadata holds the metadata items as received (startup-script among them).
	Metadata map[string]string
	Tags     []string
	// Resource is a copy of the whole stored resource, for checks the fields above miss.
	Resource *computepb.Instance
}

// NewServer starts a fake on 127.0.0.1 that is closed when the test ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		t:         t,
		instances: map[key]*computepb.Instance{},
		zones:     map[key]bool{},
		firewalls: map[key]*computepb.Firewall{},
		failures:  map[string][]failure{},
		requests:  map[string]int{},

		outcomes:   map[string][]Outcome{},
		operations: map[key]*operation{},
		byID:       map[[2]string]*operation{},
		requestIDs: map[string][]string{},
		filters:    map[string][]string{},
		deleting:   map[key]*operation{},

		firewallBusy: map[key]*operation{},
	}
	// httptest listens on 127.0.0.1 unless told otherwise by a flag no test here sets.
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// ClientOptions point a Compute client at the fake, with no credentials, through the
// fake's own HTTP client so nothing can leave the loopback interface.
func (s *Server) ClientOptions() []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(s.URL),
		option.WithoutAuthentication(),
		option.WithHTTPClient(s.srv.Client()),
	}
}

// FailNext makes the next request of method (MethodInsert, ...) fail with a Google error
// body carrying code, reason and message. Calls queue up, one answer each.
func (s *Server) FailNext(method string, code int, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[method] = append(s.failures[method], failure{code: code, reason: reason, message: message})
}

// NextOperation makes the operation of the next accepted request of method (MethodInsert,
// MethodDelete, MethodFirewallInsert, MethodFirewallUpdate or MethodFirewallDelete) go as
// o says. Calls queue up, one operation each. A request answered
// with an error (FailNext, 404, 409) or recognised by its request ID takes none.
func (s *Server) NextOperation(method string, o Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes[method] = append(s.outcomes[method], o)
}

// FailNextOperation makes the operation of the next accepted request of method end with
// an error, as GCE reports a stockout or quota refusal: the insert itself is accepted, and
// only its operation says why the instance never came.
func (s *Server) FailNextOperation(method string, httpStatus int, code, message string) {
	s.NextOperation(method, Outcome{ErrorCode: code, ErrorMessage: message, HTTPStatus: httpStatus})
}

// HoldNextOperation makes the operation of the next accepted request of method answer
// RUNNING to polls polls before it is DONE.
func (s *Server) HoldNextOperation(method string, polls int) {
	s.NextOperation(method, Outcome{RunningPolls: polls})
}

// CompleteOperations finishes every operation still running, as the time they take would.
func (s *Server) CompleteOperations() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range s.operations {
		s.complete(op)
	}
}

// ForgetRequestIDs forgets every request ID seen, as GCE does some time (at least an hour)
// after a request: a request sent again with the same ID is then new.
func (s *Server) ForgetRequestIDs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.byID)
}

// RequestIDs are the requestId parameters of every request of method, in the order
// received ("" for a request without one), so a test can check that a retry sends the
// same ID.
func (s *Server) RequestIDs(method string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requestIDs[method])
}

// Filters are the filter parameters of every request of method (MethodAggregatedList or
// MethodFirewallList), in the order received ("" for a request without one), so a test can
// check that a list asks the server for what it wants rather than read everything.
func (s *Server) Filters(method string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.filters[method])
}

// Operation is a snapshot of one operation.
type Operation struct {
	Name, Type, Status string
	// ErrorCode is the first error's code; empty for a running or successful operation.
	ErrorCode string
	// Global is set for a global operation (a firewall rule's), unset for a zonal one (an
	// instance's).
	Global bool
}

// Operations is a snapshot of every operation, in the order they were created.
func (s *Server) Operations() []Operation {
	s.mu.Lock()
	defer s.mu.Unlock()
	ops := slices.SortedFunc(maps.Values(s.operations), func(a, b *operation) int {
		return int(a.proto.GetId()) - int(b.proto.GetId())
	})
	out := make([]Operation, 0, len(ops))
	for _, op := range ops {
		snap := Operation{Name: op.proto.GetName(), Type: op.proto.GetOperationType(), Status: op.proto.GetStatus().String(),
			Global: op.proto.Zone == nil}
		if errs := op.proto.GetError().GetErrors(); len(errs) > 0 {
			snap.ErrorCode = errs[0].GetCode()
		}
		out = append(out, snap)
	}
	return out
}

// Requests is how many requests of method reached the fake, failed ones included.
func (s *Server) Requests(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[method]
}

// TotalRequests is how many requests of any kind reached the fake.
func (s *Server) TotalRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.requests {
		n += c
	}
	return n
}

// SetStatus sets the status of every instance called name (in any project or zone), as GCE
// would move it along; the test fails if there is none.
func (s *Server) SetStatus(name, status string) {
	s.t.Helper()
	s.update(name, func(inst *computepb.Instance) { inst.Status = proto.String(status) })
}

// Preempt takes a Spot VM back as GCE does: it stops (TERMINATED, with the Spot VM's
// STOP termination action) and loses its ephemeral external address. The test fails (and
// nothing changes) if the instance is not a Spot VM: GCE preempts no other.
func (s *Server) Preempt(name string) {
	s.t.Helper()
	s.update(name, func(inst *computepb.Instance) {
		if inst.GetScheduling().GetProvisioningModel() != computepb.Scheduling_SPOT.String() {
			s.t.Errorf("gcptest: %s is not a Spot VM; GCE would not preempt it", name)
			return
		}
		inst.Status = proto.String(computepb.Instance_TERMINATED.String())
		for _, nic := range inst.GetNetworkInterfaces() {
			for _, ac := range nic.GetAccessConfigs() {
				ac.NatIP = nil
			}
		}
	})
}

// SetNatIP gives the instance's external access config an address, as GCE does once the
// VM is placed.
func (s *Server) SetNatIP(name, ip string) {
	s.t.Helper()
	s.update(name, func(inst *computepb.Instance) {
		if len(inst.NetworkInterfaces) == 0 {
			inst.NetworkInterfaces = []*computepb.NetworkInterface{{}}
		}
		nic := inst.NetworkInterfaces[0]
		if len(nic.AccessConfigs) == 0 {
			nic.AccessConfigs = []*computepb.AccessConfig{{Name: proto.String("External NAT")}}
		}
		nic.AccessConfigs[0].NatIP = proto.String(ip)
	})
}

func (s *Server) update(name string, f func(*computepb.Instance)) {
	s.t.Helper()
	s.mu.Lock()
	found := false
	for k, inst := range s.instances {
		if k.name == name {
			f(inst)
			found = true
		}
	}
	s.mu.Unlock()
	if !found {
		// Errorf, not Fatalf: helpers may be called from subtests, whose goroutine is not
		// the one s.t runs on.
		s.t.Errorf("gcptest: no instance named %q", name)
	}
}

// RemoveInstance deletes an instance directly, as if deleted outside the code under test
// (by a person, or by GCE itself); the test fails if there is none.
func (s *Server) RemoveInstance(project, zone, name string) {
	s.t.Helper()
	s.mu.Lock()
	k := key{project, zone, name}
	_, ok := s.instances[k]
	delete(s.instances, k)
	s.mu.Unlock()
	if !ok {
		s.t.Errorf("gcptest: no instance %s/%s/%s", project, zone, name)
	}
}

// AddInstance stores an instance directly, as if made outside the code under test (by a
// person, or another installation). Missing status and timestamps are filled in.
func (s *Server) AddInstance(project, zone string, inst *computepb.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst = proto.CloneOf(inst)
	s.fill(project, zone, inst)
	s.instances[key{project, zone, inst.GetName()}] = inst
	s.zones[key{project: project, zone: zone}] = true
}

// Instances is a snapshot of every stored instance, ordered by project, zone and name.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(s.instances), func(a, b key) int {
		return strings.Compare(a.project+"/"+a.zone+"/"+a.name, b.project+"/"+b.zone+"/"+b.name)
	})
	out := make([]Instance, 0, len(keys))
	for _, k := range keys {
		inst := s.instances[k]
		snap := Instance{
			Project: k.project, Zone: k.zone, Name: k.name,
			Status:      inst.GetStatus(),
			MachineType: inst.GetMachineType(),
			Labels:      maps.Clone(inst.GetLabels()),
			Metadata:    map[string]string{},
			Tags:        slices.Clone(inst.GetTags().GetItems()),
			Resource:    proto.CloneOf(inst),
		}
		for _, item := range inst.GetMetadata().GetItems() {
			snap.Metadata[item.GetKey()] = item.GetValue()
		}
		if nics := inst.GetNetworkInterfaces(); len(nics) > 0 {
			snap.NetworkIP = nics[0].GetNetworkIP()
			if len(nics[0].GetAccessConfigs()) > 0 {
				snap.NatIP = nics[0].GetAccessConfigs()[0].GetNatIP()
			}
		}
		out = append(out, snap)
	}
	return out
}

// fill sets what GCE sets on insert. Callers hold s.mu.
func (s *Server) fill(project, zone string, inst *computepb.Instance) {
	s.seq++
	if inst.Status == nil {
		inst.Status = proto.String(computepb.Instance_PROVISIONING.String())
	}
	if inst.CreationTimestamp == nil {
		inst.CreationTimestamp = proto.String(timestamp(time.Now()))
	}
	inst.Id = proto.Uint64(1000 + s.seq)
	inst.Kind = proto.String("compute#instance")
	for i, nic := range inst.GetNetworkInterfaces() {
		if nic.NetworkIP == nil {
			nic.NetworkIP = proto.String(fmt.Sprintf("10.128.%d.%d", s.seq%250, i+2))
		}
	}
	inst.Zone = proto.String(s.zoneURL(project, zone))
	inst.SelfLink = proto.String(s.zoneURL(project, zone) + "/instances/" + inst.GetName())
}

func (s *Server) zoneURL(project, zone string) string {
	return fmt.Sprintf("%s/compute/v1/projects/%s/zones/%s", s.URL, project, zone)
}

func (s *Server) globalURL(project string) string {
	return fmt.Sprintf("%s/compute/v1/projects/%s/global", s.URL, project)
}

// timestamp is GCE's RFC 3339 flavour, with milliseconds and a numeric offset.
func timestamp(t time.Time) string { return t.Format("2006-01-02T15:04:05.000-07:00") }

// instanceName is GCE's rule for resource names.
var instanceName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// The filter forms the provider sends: one bare labels.<key> = "<value>", or one or more
// parenthesised ones side by side, which GCE ANDs. Anything else is refused, so a filter the
// real API would read differently fails a test instead of passing it.
var (
	labelFilter       = regexp.MustCompile(`^labels\.([a-z][-_a-z0-9]*)\s*=\s*"([^"]*)"$`)
	labelFilterAnd    = regexp.MustCompile(`^(\(\s*labels\.[a-z][-_a-z0-9]*\s*=\s*"[^"]*"\s*\)\s*)+$`)
	labelFilterParens = regexp.MustCompile(`\(\s*labels\.([a-z][-_a-z0-9]*)\s*=\s*"([^"]*)"\s*\)`)
)

// parseLabelFilter returns the label pairs f requires, all of them, or false for a form it
// does not know.
func parseLabelFilter(f string) ([][2]string, bool) {
	f = strings.TrimSpace(f)
	if m := labelFilter.FindStringSubmatch(f); m != nil {
		return [][2]string{{m[1], m[2]}}, true
	}
	if !labelFilterAnd.MatchString(f) {
		return nil, false
	}
	var want [][2]string
	for _, m := range labelFilterParens.FindAllStringSubmatch(f, -1) {
		want = append(want, [2]string{m[1], m[2]})
	}
	return want, true
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/compute/v1/"), "/")
	var method string
	switch {
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "zones" && parts[4] == "instances" && r.Method == http.MethodPost:
		method = MethodInsert
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "zones" && parts[4] == "instances" && r.Method == http.MethodGet:
		method = MethodGet
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "zones" && parts[4] == "instances" && r.Method == http.MethodDelete:
		method = MethodDelete
	case len(parts) == 4 && parts[0] == "projects" && parts[2] == "aggregated" && parts[3] == "instances" && r.Method == http.MethodGet:
		method = MethodAggregatedList
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "zones" && parts[4] == "operations" && r.Method == http.MethodGet:
		method = MethodGetOperation
	case len(parts) == 4 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "firewalls" && r.Method == http.MethodPost:
		method = MethodFirewallInsert
	case len(parts) == 4 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "firewalls" && r.Method == http.MethodGet:
		method = MethodFirewallList
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "firewalls" && r.Method == http.MethodGet:
		method = MethodFirewallGet
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "firewalls" && r.Method == http.MethodPut:
		method = MethodFirewallUpdate
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "firewalls" && r.Method == http.MethodDelete:
		method = MethodFirewallDelete
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "operations" && r.Method == http.MethodGet:
		method = MethodGetGlobalOperation
	default:
		s.t.Errorf("gcptest: unexpected request %s %s", r.Method, r.URL)
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("gcptest does not serve %s %s", r.Method, r.URL.Path))
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[method]++
	requestID := r.URL.Query().Get("requestId")
	s.requestIDs[method] = append(s.requestIDs[method], requestID)
	if method == MethodAggregatedList || method == MethodFirewallList {
		s.filters[method] = append(s.filters[method], r.URL.Query().Get("filter"))
	}
	if q := s.failures[method]; len(q) > 0 {
		s.failures[method] = q[1:]
		writeError(w, q[0].code, q[0].reason, q[0].message)
		return
	}
	if requestID != "" && (method == MethodInsert || method == MethodDelete || operationTypes[method] != "") {
		if !validRequestID(requestID) {
			writeError(w, http.StatusBadRequest, "invalid",
				fmt.Sprintf("Invalid value for field 'requestId': '%s'. The request ID must be a valid UUID with the exception that zero UUID is not supported (00000000-0000-0000-0000-000000000000).", requestID))
			return
		}
		// GCE recognises a request ID it has seen and answers with that request's
		// operation, in whatever state it is now, without acting again.
		if op, ok := s.byID[[2]string{parts[1], requestID}]; ok {
			writeProto(w, op.proto)
			return
		}
	}
	switch method {
	case MethodInsert:
		s.insert(w, r, parts[1], parts[3], requestID)
	case MethodGet:
		s.get(w, key{parts[1], parts[3], parts[5]})
	case MethodDelete:
		s.delete(w, key{parts[1], parts[3], parts[5]}, requestID)
	case MethodAggregatedList:
		s.aggregatedList(w, r, parts[1])
	case MethodGetOperation:
		s.getOperation(w, key{parts[1], parts[3], parts[5]})
	case MethodFirewallInsert:
		s.insertFirewall(w, r, parts[1], requestID)
	case MethodFirewallList:
		s.listFirewalls(w, r, parts[1])
	case MethodFirewallGet:
		s.getFirewall(w, key{project: parts[1], name: parts[4]})
	case MethodFirewallUpdate:
		s.updateFirewall(w, r, key{project: parts[1], name: parts[4]}, requestID)
	case MethodFirewallDelete:
		s.deleteFirewall(w, key{project: parts[1], name: parts[4]}, requestID)
	case MethodGetGlobalOperation:
		s.getOperation(w, key{project: parts[1], name: parts[4]})
	}
}

// uuidForm is the textual form of a UUID; GCE takes any version but the zero UUID.
var uuidForm = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func validRequestID(id string) bool {
	return uuidForm.MatchString(id) && id != "00000000-0000-0000-0000-000000000000"
}

func (s *Server) insert(w http.ResponseWriter, r *http.Request, project, zone, requestID string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	inst := &computepb.Instance{}
	// Strict decoding: a field the real API would not know is a bug in the code under test.
	if err := protojson.Unmarshal(body, inst); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload received. "+err.Error())
		return
	}
	if !instanceName.MatchString(inst.GetName()) {
		writeError(w, http.StatusBadRequest, "invalid",
			fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", inst.GetName()))
		return
	}
	if sc := inst.GetScheduling(); sc.GetProvisioningModel() == computepb.Scheduling_SPOT.String() &&
		(sc.GetAutomaticRestart() || sc.GetOnHostMaintenance() == computepb.Scheduling_MIGRATE.String()) {
		// As GCE: a Spot VM can neither restart by itself nor live-migrate.
		writeError(w, http.StatusBadRequest, "invalid",
			"Invalid value for field 'resource.scheduling': a SPOT instance requires automaticRestart false and onHostMaintenance TERMINATE")
		return
	}
	k := key{project, zone, inst.GetName()}
	if _, ok := s.instances[k]; ok {
		writeError(w, http.StatusConflict, "alreadyExists",
			fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, k.name))
		return
	}
	s.fill(project, zone, inst)
	s.instances[k] = inst
	s.zones[key{project: project, zone: zone}] = true
	op := s.newOperation(MethodInsert, project, zone, requestID, inst.GetSelfLink(), func(failed bool) {
		// The instance existed while GCE tried to place it; a failed insert leaves none.
		if failed && s.instances[k] == inst {
			delete(s.instances, k)
		}
	})
	writeProto(w, op.proto)
}

func (s *Server) get(w http.ResponseWriter, k key) {
	inst, ok := s.instances[k]
	if !ok {
		writeNotFound(w, k)
		return
	}
	writeProto(w, inst)
}

func (s *Server) delete(w http.ResponseWriter, k key, requestID string) {
	inst, ok := s.instances[k]
	if !ok {
		writeNotFound(w, k)
		return
	}
	if s.deleting[k] != nil {
		writeError(w, http.StatusBadRequest, "resourceNotReady",
			fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' is not ready", k.project, k.zone, k.name))
		return
	}
	if q := s.outcomes[MethodDelete]; len(q) == 0 || q[0] == (Outcome{}) {
		// Real GCE lingers in STOPPING for a while; by default the fake has the instance
		// gone at once, which is enough for most tests. NextOperation makes it linger.
		delete(s.instances, k)
		op := s.newOperation(MethodDelete, k.project, k.zone, requestID, inst.GetSelfLink(), func(bool) {})
		writeProto(w, op.proto)
		return
	}
	was := inst.GetStatus()
	inst.Status = proto.String(computepb.Instance_STOPPING.String())
	op := s.newOperation(MethodDelete, k.project, k.zone, requestID, inst.GetSelfLink(), func(failed bool) {
		delete(s.deleting, k)
		switch {
		case s.instances[k] != inst:
		case failed:
			inst.Status = proto.String(was)
		default:
			delete(s.instances, k)
		}
	})
	s.deleting[k] = op
	writeProto(w, op.proto)
}

// getOperation answers zoneOperations.get and, for an empty k.zone, globalOperations.get.
func (s *Server) getOperation(w http.ResponseWriter, k key) {
	op, ok := s.operations[k]
	if !ok {
		where := "zones/" + k.zone
		if k.zone == "" {
			where = "global"
		}
		writeError(w, http.StatusNotFound, "notFound",
			fmt.Sprintf("The resource 'projects/%s/%s/operations/%s' was not found", k.project, where, k.name))
		return
	}
	if op.pollsLeft > 0 {
		op.pollsLeft--
	} else {
		s.complete(op)
	}
	writeProto(w, op.proto)
}

func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request, project string) {
	match := func(*computepb.Instance) bool { return true }
	if f := r.URL.Query().Get("filter"); f != "" {
		want, ok := parseLabelFilter(f)
		if !ok {
			writeError(w, http.StatusBadRequest, "invalid",
				fmt.Sprintf("gcptest understands only labels.<key> = \"<value>\" and (labels.<key> = \"<value>\") (...) filters, not %q", f))
			return
		}
		match = func(inst *computepb.Instance) bool {
			for _, kv := range want {
				if got, ok := inst.GetLabels()[kv[0]]; !ok || got != kv[1] {
					return false
				}
			}
			return true
		}
	}
	items := map[string]*computepb.InstancesScopedList{}
	// Like GCE, every zone appears, empty ones with a warning instead of instances.
	for z := range s.zones {
		if z.project == project {
			items["zones/"+z.zone] = &computepb.InstancesScopedList{Warning: &computepb.Warning{
				Code:    proto.String("NO_RESULTS_ON_PAGE"),
				Message: proto.String("There are no results for scope 'zones/" + z.zone + "' on this page."),
			}}
		}
	}
	for k, inst := range s.instances {
		if k.project != project || !match(inst) {
			continue
		}
		scope := items["zones/"+k.zone]
		scope.Warning = nil
		scope.Instances = append(scope.Instances, inst)
	}
	for _, scope := range items {
		slices.SortFunc(scope.Instances, func(a, b *computepb.Instance) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
	writeProto(w, &computepb.InstanceAggregatedList{
		Kind:     proto.String("compute#instanceAggregatedList"),
		Id:       proto.String("projects/" + project + "/aggregated/instances"),
		Items:    items,
		SelfLink: proto.String(s.URL + "/compute/v1/projects/" + project + "/aggregated/instances"),
	})
}

// newOperation records a running operation of method, zonal or, with an empty zone,
// global, pops its Outcome and remembers it by request ID. finish is called once, when the
// operation ends. Callers hold s.mu.
func (s *Server) newOperation(method, project, zone, requestID, target string, finish func(failed bool)) *operation {
	var o Outcome
	if q := s.outcomes[method]; len(q) > 0 {
		o, s.outcomes[method] = q[0], q[1:]
	}
	s.seq++
	now := timestamp(time.Now())
	name := fmt.Sprintf("operation-%d", s.seq)
	op := &operation{
		proto: &computepb.Operation{
			Kind:          proto.String("compute#operation"),
			Id:            proto.Uint64(5000 + s.seq),
			Name:          proto.String(name),
			OperationType: proto.String(cmp.Or(operationTypes[method], method)),
			Status:        computepb.Operation_RUNNING.Enum(),
			Progress:      proto.Int32(0),
			TargetLink:    proto.String(target),
			InsertTime:    proto.String(now),
			StartTime:     proto.String(now),
		},
		outcome:   o,
		pollsLeft: o.RunningPolls,
		finish:    finish,
	}
	if zone == "" {
		// A global operation names no zone, as GCE's do not.
		op.proto.SelfLink = proto.String(fmt.Sprintf("%s/operations/%s", s.globalURL(project), name))
	} else {
		op.proto.Zone = proto.String(s.zoneURL(project, zone))
		op.proto.SelfLink = proto.String(fmt.Sprintf("%s/operations/%s", s.zoneURL(project, zone), name))
	}
	if requestID != "" {
		op.proto.ClientOperationId = proto.String(requestID) // as GCE echoes it
		s.byID[[2]string{project, requestID}] = op
	}
	s.operations[key{project, zone, name}] = op
	return op
}

// complete ends op as its Outcome says, once. Callers hold s.mu.
func (s *Server) complete(op *operation) {
	if op.proto.GetStatus() == computepb.Operation_DONE {
		return
	}
	op.pollsLeft = 0
	op.proto.Status = computepb.Operation_DONE.Enum()
	op.proto.Progress = proto.Int32(100)
	op.proto.EndTime = proto.String(timestamp(time.Now()))
	failed := op.outcome.ErrorCode != ""
	if failed {
		status := op.outcome.HTTPStatus
		if status == 0 {
			status = http.StatusBadRequest
		}
		op.proto.HttpErrorStatusCode = proto.Int32(int32(status))
		op.proto.HttpErrorMessage = proto.String(strings.ToUpper(http.StatusText(status)))
		op.proto.Error = &computepb.Error{Errors: []*computepb.Errors{{
			Code:    proto.String(op.outcome.ErrorCode),
			Message: proto.String(op.outcome.ErrorMessage),
		}}}
	}
	op.finish(failed)
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "backendError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

func writeNotFound(w http.ResponseWriter, k key) {
	writeError(w, http.StatusNotFound, "notFound",
		fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", k.project, k.zone, k.name))
}

// writeError answers in Google's JSON error shape, which the client turns into a
// googleapi.Error with the reason in Errors.
func writeError(w http.ResponseWriter, code int, reason, message string) {
	domain := "global"
	switch reason {
	case "quotaExceeded", "rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded":
		domain = "usageLimits"
	}
	type item struct {
		Domain  string `json:"domain"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	var body struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Errors  []item `json:"errors"`
		} `json:"error"`
	}
	body.Error.Code = code
	body.Error.Message = message
	body.Error.Errors = []item{{Domain: domain, Reason: reason, Message: message}}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
