package gcptest

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Firewall is a snapshot of one stored firewall rule.
type Firewall struct {
	Project, Name string
	// Network is the network's URL, as GCE reports it whatever form the rule was made with.
	Network      string
	Direction    string
	Description  string
	Priority     int32
	Disabled     bool
	SourceRanges []string
	SourceTags   []string
	TargetTags   []string
	// Allowed are the allowed protocols and ports as gcloud writes them: "tcp:3128",
	// "tcp:80,443", "icmp".
	Allowed []string
	// Resource is a copy of the whole stored rule, for checks the fields above miss.
	Resource *computepb.Firewall
}

// Firewalls is a snapshot of every stored firewall rule, ordered by project and name.
func (s *Server) Firewalls() []Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(s.firewalls), func(a, b key) int {
		return strings.Compare(a.project+"/"+a.name, b.project+"/"+b.name)
	})
	out := make([]Firewall, 0, len(keys))
	for _, k := range keys {
		fw := s.firewalls[k]
		snap := Firewall{
			Project: k.project, Name: k.name,
			Network:      fw.GetNetwork(),
			Direction:    fw.GetDirection(),
			Description:  fw.GetDescription(),
			Priority:     fw.GetPriority(),
			Disabled:     fw.GetDisabled(),
			SourceRanges: slices.Clone(fw.GetSourceRanges()),
			SourceTags:   slices.Clone(fw.GetSourceTags()),
			TargetTags:   slices.Clone(fw.GetTargetTags()),
			Resource:     proto.CloneOf(fw),
		}
		for _, a := range fw.GetAllowed() {
			rule := a.GetIPProtocol()
			if len(a.GetPorts()) > 0 {
				rule += ":" + strings.Join(a.GetPorts(), ",")
			}
			snap.Allowed = append(snap.Allowed, rule)
		}
		out = append(out, snap)
	}
	return out
}

// AddFirewall stores a rule directly, as if made outside the code under test (by a person,
// another installation, or an earlier version). Missing defaults are filled in as on insert.
func (s *Server) AddFirewall(project string, fw *computepb.Firewall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw = proto.CloneOf(fw)
	s.fillFirewall(project, fw)
	s.firewalls[key{project: project, name: fw.GetName()}] = fw
}

// RemoveFirewall deletes a rule directly, as if deleted outside the code under test (by a
// person, or a sweep on another worker); the test fails if there is none.
func (s *Server) RemoveFirewall(project, name string) {
	s.t.Helper()
	s.mu.Lock()
	k := key{project: project, name: name}
	_, ok := s.firewalls[k]
	delete(s.firewalls, k)
	s.mu.Unlock()
	if !ok {
		s.t.Errorf("gcptest: no firewall rule %s/%s", project, name)
	}
}

// fillFirewall sets what GCE sets on insert. Callers hold s.mu.
func (s *Server) fillFirewall(project string, fw *computepb.Firewall) {
	s.seq++
	fw.Id = proto.Uint64(3000 + s.seq)
	fw.Kind = proto.String("compute#firewall")
	if fw.CreationTimestamp == nil {
		fw.CreationTimestamp = proto.String(timestamp(time.Now()))
	}
	fw.SelfLink = proto.String(s.globalURL(project) + "/firewalls/" + fw.GetName())
	s.firewallDefaults(project, fw)
}

// firewallDefaults are what GCE fills in on insert and on update alike: a rule always
// reports its network as a URL, a direction, a priority and whether it is disabled.
func (s *Server) firewallDefaults(project string, fw *computepb.Firewall) {
	fw.Network = proto.String(s.networkURL(project, fw.GetNetwork()))
	if fw.Direction == nil {
		fw.Direction = proto.String(computepb.Firewall_INGRESS.String())
	}
	if fw.Priority == nil {
		fw.Priority = proto.Int32(1000)
	}
	if fw.Disabled == nil {
		fw.Disabled = proto.Bool(false)
	}
}

// networkURL is GCE's spelling of a network reference: a full URL, the project's default
// network when none is given.
func (s *Server) networkURL(project, network string) string {
	switch {
	case network == "":
		return s.globalURL(project) + "/networks/default"
	case strings.HasPrefix(network, "global/"):
		return fmt.Sprintf("%s/compute/v1/projects/%s/%s", s.URL, project, network)
	case strings.HasPrefix(network, "projects/"):
		return s.URL + "/compute/v1/" + network
	default:
		// A URL (of the real API or of this fake) is kept as given.
		return network
	}
}

// readFirewall decodes a rule from a request body and checks what GCE checks: the name,
// the ranges (all IPv4 or all IPv6), and that the rule allows or denies something.
func readFirewall(w http.ResponseWriter, r *http.Request) (*computepb.Firewall, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return nil, false
	}
	fw := &computepb.Firewall{}
	// Strict decoding: a field the real API would not know is a bug in the code under test.
	if err := protojson.Unmarshal(body, fw); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload received. "+err.Error())
		return nil, false
	}
	if !instanceName.MatchString(fw.GetName()) {
		writeError(w, http.StatusBadRequest, "invalid",
			fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", fw.GetName()))
		return nil, false
	}
	families := map[bool]bool{} // by "is IPv4"
	for i, rng := range fw.GetSourceRanges() {
		addr, err := netip.ParseAddr(rng)
		if p, perr := netip.ParsePrefix(rng); perr == nil {
			addr, err = p.Addr(), nil
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid",
				fmt.Sprintf("Invalid value for field 'resource.sourceRanges[%d]': '%s'. Must be a CIDR address range that is contained in the network.", i, rng))
			return nil, false
		}
		families[addr.Is4()] = true
	}
	if len(families) > 1 {
		writeError(w, http.StatusBadRequest, "invalid", "A firewall rule can contain either IPv4 or IPv6 source ranges, but not both.")
		return nil, false
	}
	if len(fw.GetAllowed()) == 0 == (len(fw.GetDenied()) == 0) {
		writeError(w, http.StatusBadRequest, "invalid", "Exactly one of 'allowed' or 'denied' must be specified.")
		return nil, false
	}
	return fw, true
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request, project, requestID string) {
	fw, ok := readFirewall(w, r)
	if !ok {
		return
	}
	k := key{project: project, name: fw.GetName()}
	if _, ok := s.firewalls[k]; ok {
		writeError(w, http.StatusConflict, "alreadyExists",
			fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' already exists", project, k.name))
		return
	}
	s.fillFirewall(project, fw)
	s.firewalls[k] = fw
	op := s.newOperation(MethodFirewallInsert, project, "", requestID, fw.GetSelfLink(), func(failed bool) {
		if failed && s.firewalls[k] == fw {
			delete(s.firewalls, k)
		}
	})
	writeProto(w, op.proto)
}

func (s *Server) getFirewall(w http.ResponseWriter, k key) {
	fw, ok := s.firewalls[k]
	if !ok {
		writeFirewallNotFound(w, k)
		return
	}
	writeProto(w, fw)
}

// updateFirewall is firewalls.update (PUT): the body replaces the whole rule, fields it
// leaves out taking their defaults, once the operation is done. The network cannot change.
func (s *Server) updateFirewall(w http.ResponseWriter, r *http.Request, k key, requestID string) {
	old, ok := s.firewalls[k]
	if !ok {
		writeFirewallNotFound(w, k)
		return
	}
	fw, ok := readFirewall(w, r)
	if !ok {
		return
	}
	if fw.GetName() != k.name {
		writeError(w, http.StatusBadRequest, "invalid",
			fmt.Sprintf("Invalid value for field 'resource.name': '%s'. The name cannot be changed.", fw.GetName()))
		return
	}
	if s.firewallBusy[k] != nil {
		writeError(w, http.StatusBadRequest, "resourceNotReady",
			fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' is not ready", k.project, k.name))
		return
	}
	s.firewallDefaults(k.project, fw)
	if fw.GetNetwork() != old.GetNetwork() {
		writeError(w, http.StatusBadRequest, "invalid",
			fmt.Sprintf("Invalid value for field 'resource.network': '%s'. Cannot change the network of a firewall rule.", fw.GetNetwork()))
		return
	}
	fw.Id, fw.Kind, fw.CreationTimestamp, fw.SelfLink = old.Id, old.Kind, old.CreationTimestamp, old.SelfLink
	op := s.newOperation(MethodFirewallUpdate, k.project, "", requestID, old.GetSelfLink(), func(failed bool) {
		delete(s.firewallBusy, k)
		if !failed && s.firewalls[k] == old {
			s.firewalls[k] = fw
		}
	})
	s.firewallBusy[k] = op
	writeProto(w, op.proto)
}

func (s *Server) deleteFirewall(w http.ResponseWriter, k key, requestID string) {
	fw, ok := s.firewalls[k]
	if !ok {
		writeFirewallNotFound(w, k)
		return
	}
	if s.firewallBusy[k] != nil {
		writeError(w, http.StatusBadRequest, "resourceNotReady",
			fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' is not ready", k.project, k.name))
		return
	}
	if q := s.outcomes[MethodFirewallDelete]; len(q) == 0 || q[0] == (Outcome{}) {
		// Gone at once by default, like an instance.
		delete(s.firewalls, k)
		op := s.newOperation(MethodFirewallDelete, k.project, "", requestID, fw.GetSelfLink(), func(bool) {})
		writeProto(w, op.proto)
		return
	}
	op := s.newOperation(MethodFirewallDelete, k.project, "", requestID, fw.GetSelfLink(), func(failed bool) {
		delete(s.firewallBusy, k)
		if !failed && s.firewalls[k] == fw {
			delete(s.firewalls, k)
		}
	})
	s.firewallBusy[k] = op
	writeProto(w, op.proto)
}

// firewallFilter is the one list filter form the fake knows: a regular expression (RE2,
// which Go's regexp is) that must match the whole of one field, as GCE reads
// `field eq "literal"`.
var firewallFilter = regexp.MustCompile(`^(name|description) eq "([^"]*)"$`)

func (s *Server) listFirewalls(w http.ResponseWriter, r *http.Request, project string) {
	match := func(*computepb.Firewall) bool { return true }
	if f := strings.TrimSpace(r.URL.Query().Get("filter")); f != "" {
		m := firewallFilter.FindStringSubmatch(f)
		var re *regexp.Regexp
		if m != nil {
			re, _ = regexp.Compile("^(?:" + m[2] + ")$")
		}
		if re == nil {
			writeError(w, http.StatusBadRequest, "invalid",
				fmt.Sprintf("gcptest understands only name eq \"<regexp>\" and description eq \"<regexp>\" firewall filters, not %q", f))
			return
		}
		match = func(fw *computepb.Firewall) bool {
			if m[1] == "name" {
				return re.MatchString(fw.GetName())
			}
			return re.MatchString(fw.GetDescription())
		}
	}
	list := &computepb.FirewallList{
		Kind:     proto.String("compute#firewallList"),
		Id:       proto.String("projects/" + project + "/global/firewalls"),
		SelfLink: proto.String(s.globalURL(project) + "/firewalls"),
	}
	for k, fw := range s.firewalls {
		if k.project == project && match(fw) {
			list.Items = append(list.Items, fw)
		}
	}
	slices.SortFunc(list.Items, func(a, b *computepb.Firewall) int { return strings.Compare(a.GetName(), b.GetName()) })
	writeProto(w, list)
}

func writeFirewallNotFound(w http.ResponseWriter, k key) {
	writeError(w, http.StatusNotFound, "notFound",
		fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", k.project, k.name))
}
