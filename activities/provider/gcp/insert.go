package gcp

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Names of things the instance carries that other parts of the system rely on.
const (
	// metadataStartupScript is the metadata key the guest agent runs at boot.
	metadataStartupScript = "startup-script"
	// accessConfigName is the name GCE itself gives the default external NAT, kept so
	// instances look the same whether made here or in the console.
	accessConfigName = "External NAT"
)

// maxInstanceTags is GCE's limit on an instance's network tags.
const maxInstanceTags = 64

// buildInsert turns a create request into the insert call. It is pure so the whole shape of
// a billable VM is covered by table tests, and it refuses to guess: a missing zone, machine
// type or image is the user's to fix, not ours to default. The same request always gives
// the same call, byte for byte, so a retry sends GCE exactly what the first attempt did.
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
	script, err := startupScript(req)
	if err != nil {
		return nil, err
	}
	rule, err := ruleConfigFor(req, project)
	if err != nil {
		return nil, err
	}

	labels := make(map[string]string, len(g.Labels)+4)
	for k, v := range g.Labels {
		labels[k] = string(v)
	}
	// Copied last so a user label can never disown an instance from the sweeper, or hide
	// its use of a shared rule from it.
	maps.Copy(labels, req.Labels())
	if rule != nil {
		labels[labelFirewall] = rule.name()
	}

	nic := &computepb.NetworkInterface{}
	if externalIP(g) {
		nic.AccessConfigs = []*computepb.AccessConfig{{
			Name: proto.String(accessConfigName),
			Type: proto.String(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}}
	}
	if g.Network != "" {
		nic.Network = proto.String(networkPath(g.Network))
	}
	if g.Subnetwork != "" {
		nic.Subnetwork = proto.String(subnetworkPath(g.Subnetwork, g.Zone))
	}

	// The shared firewall rule's name is one of the instance's tags: the rule (see
	// ruleConfig) targets its instances by it. The user's tags are kept, for the rules of
	// their own they select.
	tags := make([]string, 0, len(g.Tags)+1)
	for _, t := range g.Tags {
		if t := string(t); !slices.Contains(tags, t) && (rule == nil || t != rule.name()) {
			tags = append(tags, t)
		}
	}
	if rule != nil {
		tags = append(tags, rule.name())
	}
	if len(tags) > maxInstanceTags {
		return nil, provider.Permanent(fmt.Errorf(
			"spec.gcp.tags has %d tags: GCE allows %d per instance, and the provider adds one for the firewall rule that admits crawlers", len(g.Tags), maxInstanceTags))
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
		Metadata: &computepb.Metadata{Items: []*computepb.Items{{
			Key:   proto.String(metadataStartupScript),
			Value: proto.String(string(script)),
		}}},
	}
	if rule != nil {
		// Recorded where nobody can change it (an instance's description is set at insert
		// only), so Get can put the rule back from the instance alone.
		inst.Description = proto.String(rule.instanceDescription())
	}
	if len(tags) > 0 {
		inst.Tags = &computepb.Tags{Items: tags}
	}
	if g.Spot {
		inst.Scheduling = spotScheduling()
	}
	return &computepb.InsertInstanceRequest{Project: project, Zone: g.Zone, InstanceResource: inst}, nil
}

// spotScheduling makes a Spot VM that Compute Engine stops, rather than deletes, when it
// takes the capacity back: a stopped instance still answers Get, so the provider can tell
// a preemption (see preempted) from an instance deleted behind the workflow's back. The
// workflow deletes it as it creates the next one. Spot VMs cannot restart by themselves or
// live-migrate.
func spotScheduling() *computepb.Scheduling {
	return &computepb.Scheduling{
		ProvisioningModel:         proto.String(computepb.Scheduling_SPOT.String()),
		InstanceTerminationAction: proto.String(computepb.Scheduling_STOP.String()),
		OnHostMaintenance:         proto.String(computepb.Scheduling_TERMINATE.String()),
		AutomaticRestart:          proto.Bool(false),
	}
}

// externalIP reports whether the instance gets a public address: spec.gcp.externalIP,
// which the API server defaults to true and which code takes as true when it is unset (a
// spec that never went through the API server).
func externalIP(g *v1alpha1.GCPSpec) bool { return g.ExternalIP == nil || *g.ExternalIP }

// startupScript is the instance's whole boot configuration (squid.InstanceScript). The
// script holds the password's hash and the cloud-init data, so it is as secret as both
// (see redact). Everything it checks comes from the spec or the fleet key: a retry
// renders the same refusal, so a refusal is permanent.
func startupScript(req provider.CreateRequest) ([]byte, error) {
	script, err := squid.InstanceScript(req.Port, req.Credentials, req.Spec.Egress, req.CloudInit)
	if err != nil {
		return nil, provider.Permanent(err)
	}
	return script, nil
}

// startupScriptOf is the startup-script metadata of an insert built by buildInsert.
func startupScriptOf(ins *computepb.InsertInstanceRequest) []byte {
	for _, item := range ins.GetInstanceResource().GetMetadata().GetItems() {
		if item.GetKey() == metadataStartupScript {
			return []byte(item.GetValue())
		}
	}
	return nil
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
