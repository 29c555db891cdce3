package gcp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func gcpRequest(name string, g *v1alpha1.GCPSpec) provider.CreateRequest {
	return provider.CreateRequest{
		Name:         name,
		ProxyUID:     "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
		Installation: "prod-eu",
		Namespace:    "crawl",
		Port:         3128,
		Spec:         v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: g},
	}
}

func minimalSpec() *v1alpha1.GCPSpec {
	return &v1alpha1.GCPSpec{
		Zone:        "europe-west1-b",
		MachineType: "e2-micro",
		Image:       "projects/debian-cloud/global/images/family/debian-12",
	}
}

// The expected bodies are the JSON the client puts on the wire, so a change in the VM's
// shape shows up here as a readable diff.
func TestBuildInsert(t *testing.T) {
	tests := []struct {
		name      string
		req       func() provider.CreateRequest
		project   string
		wantZone  string
		wantBody  string
		wantError string
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
				"labels": {
					"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
					"proxyfleet-installation": "prod-eu",
					"proxyfleet-managed-by": "proxyfleet"
				}
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
				"tags": {"items": ["squid", "egress"]},
				"metadata": {"items": [{"key": "startup-script", "value": "#!/bin/sh\necho hi\n"}]},
				"labels": {
					"team": "crawl",
					"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
					"proxyfleet-installation": "prod-eu",
					"proxyfleet-managed-by": "proxyfleet"
				}
			}`,
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
				"labels": {
					"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
					"proxyfleet-installation": "prod-eu",
					"proxyfleet-managed-by": "proxyfleet"
				}
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
				"labels": {
					"env": "prod",
					"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
					"proxyfleet-installation": "prod-eu",
					"proxyfleet-managed-by": "proxyfleet"
				}
			}`,
		},
		{
			name:      "no gcp block",
			req:       func() provider.CreateRequest { return gcpRequest("px-e", nil) },
			project:   "proj-a",
			wantError: "spec.gcp",
		},
		{
			name:      "no project anywhere",
			req:       func() provider.CreateRequest { return gcpRequest("px-e", minimalSpec()) },
			project:   "",
			wantError: "spec.gcp.project",
		},
		{
			name: "missing zone",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Zone = ""
				return gcpRequest("px-e", g)
			},
			project:   "proj-a",
			wantError: "spec.gcp.zone",
		},
		{
			name: "missing machine type",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.MachineType = ""
				return gcpRequest("px-e", g)
			},
			project:   "proj-a",
			wantError: "spec.gcp.machineType",
		},
		{
			name: "missing image",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Image = ""
				return gcpRequest("px-e", g)
			},
			project:   "proj-a",
			wantError: "spec.gcp.image",
		},
		{
			name:      "missing name",
			req:       func() provider.CreateRequest { return gcpRequest("", minimalSpec()) },
			project:   "proj-a",
			wantError: "name",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := buildInsert(tc.req(), tc.project)
			if tc.wantError != "" {
				require.Error(t, err)
				assert.Equal(t, provider.KindPermanent, provider.Class(err))
				assert.Contains(t, err.Error(), tc.wantError)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.project, got.GetProject())
			assert.Equal(t, tc.wantZone, got.GetZone())
			body, err := protojson.Marshal(got.GetInstanceResource())
			require.NoError(t, err)
			assert.JSONEq(t, tc.wantBody, string(body))
		})
	}
}
