package gcp

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// Names of things the instance carries that other parts of the system rely on.
const (
	// metadataStartupScript is the metadata key the guest agent runs at boot.
	metadataStartupScript = "startup-script"
	// accessConfigName is the name GCE itself gives the default external NAT, kept so
	// instances look the same whether made here or in the console.
	accessConfigName = "External NAT"
)

// buildInsert turns a create request into the insert call. It is pure so the whole shape of
// a billable VM is covered by table tests, and it refuses to guess: a missing zone, machine
// type or image is the user's to fix, not ours to default.
func buildInsert(req provider.CreateRequest, project string) (*computepb.InsertInstanceRequest, error) {
	g := req.Spec.GCP
	switch {
	case g == nil:
		return nil, provider.Permanent(errors.New("spec.gcp is missing: the gcp provider needs zone, machineType and image"))
	case project == "":
		return nil, provider.Permanent(errors.New("spec.gcp.project is empty and the worker has no default project"))
	case g.Zone == "":
		return nil, provider.Permanent(errors.New("spec.gcp.zone is required"))
	case g.MachineType == "":
		return nil, provider.Permanent(errors.New("spec.gcp.machineType is required"))
	case g.Image == "":
		return nil, provider.Permanent(errors.New("spec.gcp.image is required"))
	case req.Name == "":
		return nil, provider.Permanent(errors.New("instance name is empty"))
	}

	labels := make(map[string]string, len(g.Labels)+3)
	for k, v := range g.Labels {
		labels[k] = string(v)
	}
	// Copied last so a user label can never disown an instance from the sweeper.
	maps.Copy(labels, req.Labels())

	nic := &computepb.NetworkInterface{
		AccessConfigs: []*computepb.AccessConfig{{
			Name: proto.String(accessConfigName),
			Type: proto.String(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}},
	}
	if g.Network != "" {
		nic.Network = proto.String(networkPath(g.Network))
	}
	if g.Subnetwork != "" {
		nic.Subnetwork = proto.String(subnetworkPath(g.Subnetwork, g.Zone))
	}

	inst := &computepb.Instance{
		Name:        proto.String(req.Name),
		MachineType: proto.String(machineTypePath(g.MachineType, g.Zone)),
		Labels:      labels,
		Disks: []*computepb.AttachedDisk{{
			AutoDelete:       proto.Bool(true),
			Boot:             proto.Bool(true),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: proto.String(g.Image)},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{nic},
	}
	if len(g.Tags) > 0 {
		tags := make([]string, len(g.Tags))
		for i, t := range g.Tags {
			tags[i] = string(t)
		}
		inst.Tags = &computepb.Tags{Items: tags}
	}
	if len(req.CloudInit) > 0 {
		inst.Metadata = &computepb.Metadata{Items: []*computepb.Items{{
			Key:   proto.String(metadataStartupScript),
			Value: proto.String(string(req.CloudInit)),
		}}}
	}
	return &computepb.InsertInstanceRequest{Project: project, Zone: g.Zone, InstanceResource: inst}, nil
}

// machineTypePath accepts the short name users write ("e2-micro"); the API wants a zonal
// path, and anything already containing a slash is taken as a path or URL the user meant.
func machineTypePath(machineType, zone string) string {
	if strings.Contains(machineType, "/") {
		return machineType
	}
	return fmt.Sprintf("zones/%s/machineTypes/%s", zone, machineType)
}

// networkPath expands a bare network name, which the API (unlike gcloud) does not accept.
func networkPath(network string) string {
	if strings.Contains(network, "/") {
		return network
	}
	return "global/networks/" + network
}

// subnetworkPath expands a bare subnetwork name; subnetworks are regional, and an instance
// can only use one in its own zone's region.
func subnetworkPath(subnetwork, zone string) string {
	if strings.Contains(subnetwork, "/") {
		return subnetwork
	}
	region := zone
	if i := strings.LastIndex(zone, "-"); i > 0 {
		region = zone[:i]
	}
	return fmt.Sprintf("regions/%s/subnetworks/%s", region, subnetwork)
}
