package gcp

import (
	"fmt"
	"net/netip"
	"regexp"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// testPassword is a canary: no error, log line or API response a test sees may carry it.
const testPassword = "canary-9d2f6b1e-proxy-password"

var testCredentials = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: testPassword}

func gcpRequest(name string, g *v1alpha1.GCPSpec) provider.CreateRequest {
	return provider.CreateRequest{
		Name:         name,
		ProxyUID:     "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
		Installation: "prod-eu",
		Namespace:    "crawl",
		Port:         3128,
		Spec:         v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: g},
		Credentials:  testCredentials,
		KeyID:        "0a1b2c3d",
	}
}

// minimalSpec is the least a Proxy that went through the API server has: an external IP
// (the default) needs the ranges crawlers connect from.
func minimalSpec() *v1alpha1.GCPSpec {
	return &v1alpha1.GCPSpec{
		Zone:                "europe-west1-b",
		MachineType:         "e2-micro",
		Image:               "projects/debian-cloud/global/images/family/debian-12",
		AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"},
	}
}

// wantScript is the startup script squid's own API renders for cfg (port 3128 and the
// test credentials unless cfg says otherwise) followed by userScript: what the instance
// must boot with.
func wantScript(t *testing.T, cfg squid.Config, userScript []byte) string {
	t.Helper()
	if cfg.Port == 0 {
		cfg.Port = 3128
	}
	if cfg.Credentials.Empty() {
		cfg.Credentials = testCredentials
	}
	files, err := squid.Render(cfg)
	require.NoError(t, err)
	script, err := squid.StartupScript(files, userScript)
	require.NoError(t, err)
	return string(script)
}

// metadataOf is the instance's metadata as a map.
func metadataOf(inst *computepb.Instance) map[string]string {
	m := map[string]string{}
	for _, item := range inst.GetMetadata().GetItems() {
		m[item.GetKey()] = item.GetValue()
	}
	return m
}

const ownershipLabels = `
	"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
	"proxyfleet-installation": "prod-eu",
	"proxyfleet-managed-by": "proxyfleet",
	"proxyfleet-key-id": "0a1b2c3d"`

// The expected bodies are the JSON the client puts on the wire, so a change in the VM's
// shape shows up here as a readable diff. The startup script, too long to read in a diff,
// is checked on its own against what the squid package renders for the request.
func TestBuildInsert(t *testing.T) {
	tests := []struct {
		name     string
		req      func() provider.CreateRequest
		project  string
		wantZone string
		wantBody string
		// squid is the Squid configuration the script must carry (port and credentials
		// default to the request's), user the cloud-init data it must run after it.
		squid squid.Config
		user  []byte
	}{
		{
			name:     "minimal spec",
			req:      func() provider.CreateRequest { return gcpRequest("px-a", minimalSpec()) },
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-a",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["px-a"]},
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "full spec with cloud-init",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Network = "crawl-net"
				g.Subnetwork = "crawl-sub"
				g.Tags = []v1alpha1.NetworkTag{"squid", "egress"}
				g.Labels = map[string]v1alpha1.GCPLabelValue{"team": "crawl"}
				r := gcpRequest("px-b", g)
				r.CloudInit = []byte("#!/bin/sh\necho hi\n")
				return r
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-b",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{
					"network": "global/networks/crawl-net",
					"subnetwork": "regions/europe-west1/subnetworks/crawl-sub",
					"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
				}],
				"tags": {"items": ["squid", "egress", "px-b"]},
				"labels": {"team": "crawl",` + ownershipLabels + `}
			}`,
			user: []byte("#!/bin/sh\necho hi\n"),
		},
		{
			name: "paths and URLs are kept as written",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.MachineType = "zones/europe-west1-b/machineTypes/n2-custom-2-4096"
				g.Image = "https://www.googleapis.com/compute/v1/projects/my-images/global/images/squid-7"
				g.Network = "projects/host-proj/global/networks/shared"
				g.Subnetwork = "projects/host-proj/regions/europe-west1/subnetworks/shared-sub"
				return gcpRequest("px-c", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-c",
				"machineType": "zones/europe-west1-b/machineTypes/n2-custom-2-4096",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "https://www.googleapis.com/compute/v1/projects/my-images/global/images/squid-7"}}],
				"networkInterfaces": [{
					"network": "projects/host-proj/global/networks/shared",
					"subnetwork": "projects/host-proj/regions/europe-west1/subnetworks/shared-sub",
					"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
				}],
				"tags": {"items": ["px-c"]},
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "user labels cannot override ownership labels",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Labels = map[string]v1alpha1.GCPLabelValue{
					provider.LabelProxyUID:     "someone-else",
					provider.LabelInstallation: "other",
					provider.LabelManagedBy:    "terraform",
					"env":                      "prod",
				}
				return gcpRequest("px-d", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-d",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["px-d"]},
				"labels": {"env": "prod",` + ownershipLabels + `}
			}`,
		},
		{
			name: "no external IP: no access config",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.ExternalIP = proto.Bool(false)
				g.AllowedSourceRanges = nil
				return gcpRequest("px-e", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-e",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{}],
				"tags": {"items": ["px-e"]},
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "external IP asked for explicitly; a user tag equal to the name is not repeated",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.ExternalIP = proto.Bool(true)
				g.Tags = []v1alpha1.NetworkTag{"px-f", "squid"}
				return gcpRequest("px-f", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-f",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["squid", "px-f"]},
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "egress, port and cloud-init reach the script",
			req: func() provider.CreateRequest {
				r := gcpRequest("px-g", minimalSpec())
				r.Port = 8080
				r.Spec.Egress = &v1alpha1.Egress{
					AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16", "fd00:1::/32"},
					Ports:               []v1alpha1.PortNumber{443, 8443},
				}
				r.CloudInit = []byte("#!/bin/sh\necho 'http_access deny all' > /etc/squid/extra.conf\n")
				return r
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-g",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["px-g"]},
				"labels": {` + ownershipLabels + `}
			}`,
			squid: squid.Config{
				Port:    8080,
				Ports:   []int32{443, 8443},
				Allowed: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:1::/32")},
			},
			user: []byte("#!/bin/sh\necho 'http_access deny all' > /etc/squid/extra.conf\n"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req()
			got, err := buildInsert(req, tc.project)
			require.NoError(t, err)
			assert.Equal(t, tc.project, got.GetProject())
			assert.Equal(t, tc.wantZone, got.GetZone())

			inst := proto.CloneOf(got.GetInstanceResource())
			assert.Equal(t, map[string]string{metadataStartupScript: wantScript(t, tc.squid, tc.user)}, metadataOf(inst),
				"the startup script is squid's rendering for the request, the cloud-init data run after it")
			inst.Metadata = nil
			body, err := protojson.Marshal(inst)
			require.NoError(t, err)
			assert.JSONEq(t, tc.wantBody, string(body))
			assert.NotContains(t, string(body), testPassword)
		})
	}
}

func TestBuildInsertRefuses(t *testing.T) {
	tooManyTags := minimalSpec()
	for i := range maxInstanceTags {
		tooManyTags.Tags = append(tooManyTags.Tags, v1alpha1.NetworkTag(fmt.Sprintf("tag-%d", i)))
	}
	tests := []struct {
		name      string
		req       func() provider.CreateRequest
		project   string
		wantError string
	}{
		{"no gcp block", func() provider.CreateRequest { return gcpRequest("px-e", nil) }, "proj-a", "spec.gcp"},
		{"no project anywhere", func() provider.CreateRequest { return gcpRequest("px-e", minimalSpec()) }, "", "spec.gcp.project"},
		{"missing zone", func() provider.CreateRequest {
			g := minimalSpec()
			g.Zone = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.zone"},
		{"missing machine type", func() provider.CreateRequest {
			g := minimalSpec()
			g.MachineType = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.machineType"},
		{"missing image", func() provider.CreateRequest {
			g := minimalSpec()
			g.Image = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.image"},
		{"missing name", func() provider.CreateRequest { return gcpRequest("", minimalSpec()) }, "proj-a", "name"},
		{"no credentials", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials = proxyauth.Credentials{}
			return r
		}, "proj-a", "open proxy"},
		{"no password", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials.Password = ""
			return r
		}, "proj-a", "open proxy"},
		{"no user name", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials.Username = ""
			return r
		}, "proj-a", "open proxy"},
		{"egress destination not a CIDR", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"10.0.0.0/8", "10.1.2.3"}}
			return r
		}, "proj-a", "spec.egress.allowedDestinations[1]"},
		{"egress port out of range", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Spec.Egress = &v1alpha1.Egress{Ports: []v1alpha1.PortNumber{443, 70000}}
			return r
		}, "proj-a", "70000"},
		{"no port", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Port = 0
			return r
		}, "proj-a", "port"},
		{"too many tags with the instance's own", func() provider.CreateRequest { return gcpRequest("px-e", tooManyTags) }, "proj-a", "spec.gcp.tags"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildInsert(tc.req(), tc.project)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.wantError)
			assert.NotContains(t, err.Error(), testPassword)
		})
	}
}

// A retried create must send GCE the very same instance: the request ID says "the same
// request", and the script holds a password hash whose salt must not vary.
func TestBuildInsertIsDeterministic(t *testing.T) {
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho hi\n")
	req.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16", "10.0.0.0/8"}, Ports: []v1alpha1.PortNumber{8443, 443}}
	first, err := buildInsert(req, "proj-a")
	require.NoError(t, err)
	for range 3 {
		again, err := buildInsert(req, "proj-a")
		require.NoError(t, err)
		assert.True(t, proto.Equal(first, again), "same request, same insert")
		assert.Equal(t, startupScriptOf(first), startupScriptOf(again))
	}

	other := req
	other.Credentials.Password = testPassword + "-other"
	differs, err := buildInsert(other, "proj-a")
	require.NoError(t, err)
	assert.NotEqual(t, startupScriptOf(first), startupScriptOf(differs), "the script carries the credentials")
}

// The rule buildFirewall wants, as a table: ranges, network, port, target and ownership.
func TestBuildFirewall(t *testing.T) {
	const desc = ruleDescriptionPrefix + " proxyfleet-installation=prod-eu proxyfleet-uid=0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10 proxyfleet-zone=europe-west1-b"
	tests := []struct {
		name     string
		edit     func(*provider.CreateRequest)
		wantBody string // "" for no rule
	}{
		{
			name: "minimal spec",
			edit: func(*provider.CreateRequest) {},
			wantBody: `{
				"name": "px-a", "description": "` + desc + `",
				"network": "global/networks/default", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["px-a"]
			}`,
		},
		{
			name: "ranges canonical, sorted, once; the spec's network and port",
			edit: func(r *provider.CreateRequest) {
				r.Port = 8080
				r.Spec.GCP.Network = "crawl-net"
				r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "198.51.100.7/24", "192.0.2.1/32", "203.0.113.9/24"}
			},
			wantBody: `{
				"name": "px-a", "description": "` + desc + `",
				"network": "global/networks/crawl-net", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["192.0.2.1/32", "198.51.100.0/24", "203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["8080"]}],
				"targetTags": ["px-a"]
			}`,
		},
		{
			name: "a network path in the instance's project",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.Network = "https://www.googleapis.com/compute/v1/projects/proj-a/global/networks/crawl-net"
			},
			wantBody: `{
				"name": "px-a", "description": "` + desc + `",
				"network": "https://www.googleapis.com/compute/v1/projects/proj-a/global/networks/crawl-net",
				"direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["px-a"]
			}`,
		},
		{
			name: "internal address with ranges still gets a rule",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.ExternalIP = proto.Bool(false)
				r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"10.8.0.0/14"}
			},
			wantBody: `{
				"name": "px-a", "description": "` + desc + `",
				"network": "global/networks/default", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["10.8.0.0/14"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["px-a"]
			}`,
		},
		{
			name: "internal address without ranges: the VPC's rules decide",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.ExternalIP = proto.Bool(false)
				r.Spec.GCP.AllowedSourceRanges = nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := gcpRequest("px-a", minimalSpec())
			tc.edit(&req)
			got, err := buildFirewall(req, ref{project: "proj-a", zone: "europe-west1-b", name: "px-a"})
			require.NoError(t, err)
			if tc.wantBody == "" {
				assert.Nil(t, got)
				return
			}
			body, err := protojson.Marshal(got)
			require.NoError(t, err)
			assert.JSONEq(t, tc.wantBody, string(body))
			owner, ok := parseRuleOwner(got.GetDescription())
			require.True(t, ok, "the description parses back")
			assert.Equal(t, ruleOwner{installation: "prod-eu", uid: req.ProxyUID, zone: "europe-west1-b"}, owner)
		})
	}
}

func TestBuildFirewallRefuses(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(*provider.CreateRequest)
		wantError string
	}{
		{"external IP by default without ranges", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = nil
		}, "spec.gcp.allowedSourceRanges is required"},
		{"external IP asked for without ranges", func(r *provider.CreateRequest) {
			r.Spec.GCP.ExternalIP = proto.Bool(true)
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{}
		}, "spec.gcp.allowedSourceRanges is required"},
		{"a range that is not a CIDR", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "crawlers"}
		}, "spec.gcp.allowedSourceRanges[1]"},
		{"an IPv6 range", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "2001:db8::/32"}
		}, "spec.gcp.allowedSourceRanges[1]"},
		{"an IPv4-mapped IPv6 range", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"::ffff:203.0.113.0/120"}
		}, "IPv6"},
		{"a Shared VPC network", func(r *provider.CreateRequest) {
			r.Spec.GCP.Network = "projects/host-proj/global/networks/shared"
		}, "host-proj"},
		{"an installation the description could not carry", func(r *provider.CreateRequest) {
			r.Installation = "prod eu"
		}, "label values"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := gcpRequest("px-a", minimalSpec())
			tc.edit(&req)
			_, err := buildFirewall(req, ref{project: "proj-a", zone: "europe-west1-b", name: "px-a"})
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.wantError)
		})
	}
}

func TestRuleOwnerParsing(t *testing.T) {
	o := ruleOwner{installation: "prod-eu", uid: "u-1", zone: "us-central1-a"}
	got, ok := parseRuleOwner(o.description())
	require.True(t, ok)
	assert.Equal(t, o, got)
	assert.Equal(t, map[string]string{
		provider.LabelInstallation: "prod-eu", provider.LabelProxyUID: "u-1", provider.LabelManagedBy: provider.ManagedByValue,
	}, o.labels())

	for _, d := range []string{
		"",
		"allow squid from the office",
		ruleDescriptionPrefix,
		ruleDescriptionPrefix + " proxyfleet-installation=prod-eu proxyfleet-uid=u-1",
		ruleDescriptionPrefix + " proxyfleet-installation=prod-eu proxyfleet-uid=u-1 proxyfleet-zone=z extra=1",
		"x" + o.description(),
	} {
		_, ok := parseRuleOwner(d)
		assert.False(t, ok, d)
	}
}

// The list filter's literal is a regular expression; the prefix must be its own pattern.
func TestRuleFilterPrefixHasNoMetacharacters(t *testing.T) {
	assert.Equal(t, ruleDescriptionPrefix, regexp.QuoteMeta(ruleDescriptionPrefix))
	assert.Equal(t, `description eq "`+ruleDescriptionPrefix+`.*"`, ruleFilter)
}
