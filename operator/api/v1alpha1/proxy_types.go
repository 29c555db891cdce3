package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode says who runs the proxy.
// +kubebuilder:validation:Enum=Managed;External
type Mode string

const (
	// ModeManaged proxies are provisioned, replaced and deleted by this system.
	ModeManaged Mode = "Managed"
	// ModeExternal proxies already exist elsewhere; they are only probed and offered.
	ModeExternal Mode = "External"
)

// Provider names a registered instance provider.
// +kubebuilder:validation:Enum=aws;gcp;kubernetes;local
type Provider string

// Providers known to the worker's registry.
const (
	ProviderAWS        Provider = "aws"
	ProviderGCP        Provider = "gcp"
	ProviderKubernetes Provider = "kubernetes"
	ProviderLocal      Provider = "local"
)

// DefaultManagedPort is the port a Managed proxy listens on when spec.port is not set:
// Squid's conventional port, which the cloud instances and the Squid pod all use.
const DefaultManagedPort int32 = 3128

// The aws provider's defaults for spec.aws.instanceType and spec.aws.ami: the smallest
// general-purpose x86 type and the public SSM parameter of Debian 12's current amd64 image.
const (
	DefaultAWSInstanceType = "t3.micro"
	DefaultAWSAMI          = "/aws/service/debian/release/12/latest/amd64"
)

// DefaultSquidImage is the pinned image of the kubernetes provider's Squid pods.
const DefaultSquidImage = "ubuntu/squid:6.6-24.04_beta"

// Duration is a Go duration string such as "10s", "5m" or "1h30m". The pattern keeps
// CEL's duration() from failing at admission with an opaque evaluation error: at most six
// digits per unit and 16 characters in all cannot exceed the ~292 years a duration holds,
// so a value too large is refused by the schema, naming the field.
// +kubebuilder:validation:Pattern=`^([0-9]{1,6}(\.[0-9]{1,9})?(ns|us|ms|s|m|h))+$`
// +kubebuilder:validation:MaxLength=16
type Duration string

// ProxySpec is the desired state of one egress proxy.
//
// The rules below are evaluated by the API server, so a Proxy that could never work is
// refused with a message naming the field instead of failing later inside a workflow.
//
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || has(self.endpoint)",message="External proxies need spec.endpoint (host and port)"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.provider)",message="External proxies take no spec.provider: nothing is provisioned for them"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.cloudInit)",message="spec.cloudInit is for Managed proxies only"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !(has(self.aws) || has(self.gcp) || has(self.kubernetes) || has(self.local))",message="External proxies take no provider block (aws, gcp, kubernetes, local)"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.port)",message="spec.port is for Managed proxies; External proxies set spec.endpoint.port"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.lifecycle)",message="spec.lifecycle is for Managed proxies only: an External endpoint cannot be replaced"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.egress)",message="spec.egress is for Managed proxies only: an External proxy's rules are its operator's"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || has(self.provider)",message="Managed proxies need spec.provider (aws, gcp, kubernetes or local)"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || !has(self.endpoint)",message="spec.endpoint is for External proxies; a Managed proxy's address comes from its instance"
// +kubebuilder:validation:XValidation:rule="!has(self.provider) || self.provider != 'aws' || has(self.aws)",message="provider aws needs the spec.aws block (at least its region)"
// +kubebuilder:validation:XValidation:rule="!has(self.provider) || self.provider != 'gcp' || has(self.gcp)",message="provider gcp needs the spec.gcp block"
// +kubebuilder:validation:XValidation:rule="!has(self.provider) || self.provider != 'kubernetes' || has(self.kubernetes)",message="provider kubernetes needs the spec.kubernetes block"
// +kubebuilder:validation:XValidation:rule="!has(self.provider) || self.provider != 'local' || has(self.local)",message="provider local needs the spec.local block"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || (has(self.aws) ? 1 : 0) + (has(self.gcp) ? 1 : 0) + (has(self.kubernetes) ? 1 : 0) + (has(self.local) ? 1 : 0) <= 1",message="set only the block of spec.provider (one of aws, gcp, kubernetes, local)"
type ProxySpec struct {
	// Mode is Managed (this system runs the instance) or External (an existing endpoint
	// that is only probed and offered). It cannot change after creation.
	// +kubebuilder:default=Managed
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.mode is immutable; create a new Proxy instead"
	// +optional
	Mode Mode `json:"mode,omitempty"`

	// Provider is the registry name of the provider that runs a Managed proxy's instance.
	// Changing it replaces the instance make-before-break, across providers.
	// +optional
	Provider Provider `json:"provider,omitempty"`

	// Endpoint is the address of an External proxy.
	// +optional
	Endpoint *Endpoint `json:"endpoint,omitempty"`

	// Port is the port a Managed proxy's instance listens on (default 3128).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Attributes are the selector labels crawlers lease by (region, country, ...). Keys and
	// values follow the rules of Kubernetes label names and values.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 63 && k.matches('^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$'))",message="attribute keys must be 1-63 lowercase alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
	// +optional
	Attributes map[string]AttributeValue `json:"attributes,omitempty"`

	// CloudInit points at a Secret whose data is given to a Managed instance at boot (gcp: the
	// startup-script metadata; kubernetes: mounted as squid.conf; local: not used). Only a hash
	// of it ever leaves the worker; rotating it replaces the instance. The Secret must carry the
	// label crawl.example.com/cloud-init: "true".
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// HealthCheck says how the proxy is probed, through itself.
	HealthCheck HealthCheck `json:"healthCheck"`

	// AWS configures an EC2 instance (provider aws).
	// +optional
	AWS *AWSSpec `json:"aws,omitempty"`

	// GCP configures a Compute Engine instance (provider gcp).
	// +optional
	GCP *GCPSpec `json:"gcp,omitempty"`

	// Kubernetes configures a Squid pod (provider kubernetes).
	// +optional
	Kubernetes *KubernetesSpec `json:"kubernetes,omitempty"`

	// Local configures a forward proxy on the worker host's loopback (provider local).
	// +optional
	Local *LocalSpec `json:"local,omitempty"`

	// Lifecycle sets when a Managed proxy is replaced without being asked.
	// +optional
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`

	// Egress limits where a Managed proxy forwards to. Changing it replaces the instance.
	// +optional
	Egress *Egress `json:"egress,omitempty"`

	// MaxLeases is how many crawler leases the proxy holds at once. The default of 4 lets a
	// proxy carry a few sticky sessions without one crawler's volume getting it banned.
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxLeases int32 `json:"maxLeases,omitempty"`
}

// AttributeValue is a selector label value, validated like a Kubernetes label value.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')",message="attribute values must be at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
type AttributeValue string

// Endpoint is a host and port.
type Endpoint struct {
	// Host is a DNS name or an IP address (IPv6 without brackets): something that can be
	// dialled as a host.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*[.]?$')",message="endpoint.host must be a DNS name or an IP address (IPv6 without brackets), not a URL or host:port"
	Host string `json:"host"`

	// Port is the proxy's TCP port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// CredentialsSecretRef names a Secret in the Proxy's namespace whose keys username and
	// password (the kubernetes.io/basic-auth layout) the proxy requires. The Secret must
	// carry the label crawl.example.com/proxy-credentials: "true", or it is not read and
	// the Proxy is Unhealthy (reason CredentialsNotLabelled). Probes send them, and
	// crawlers receive them in lease answers only. Changing the Secret's data or label
	// takes effect within the worker's drift interval (2 minutes by default): the next
	// lease gets the new ones. Unset for a proxy that takes no credentials.
	// +optional
	CredentialsSecretRef *SecretRef `json:"credentialsSecretRef,omitempty"`
}

// SecretRef names a Secret in the Proxy's namespace.
type SecretRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// Keys of an External proxy's credentials Secret.
const (
	CredentialsUsernameKey = "username"
	CredentialsPasswordKey = "password"
)

// Egress limits where a Managed proxy forwards to. Whatever is set here, the proxy requires
// the credentials the system gave it and strips X-Forwarded-For, Via, Forwarded and
// Proxy-Authorization before a request leaves it.
type Egress struct {
	// AllowedDestinations are networks the proxy may reach although they are refused by
	// default: loopback, link-local (the cloud metadata server at 169.254.169.254), private
	// (10/8, 172.16/12, 192.168/16, fc00::/7) and shared (100.64/10) ranges. Each is a CIDR
	// such as 10.20.0.0/16. Allow only what crawlers must reach through the proxy: anything
	// allowed is reachable by every holder of the proxy's credentials.
	// +kubebuilder:validation:MaxItems=32
	// +listType=set
	// +optional
	AllowedDestinations []CIDR `json:"allowedDestinations,omitempty"`

	// Ports are the destination ports requests and CONNECT tunnels may go to (default 80
	// and 443).
	// +kubebuilder:validation:MaxItems=32
	// +listType=set
	// +optional
	Ports []PortNumber `json:"ports,omitempty"`
}

// CIDR is an IPv4 or IPv6 network in CIDR notation.
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.20.0.0/16 or fd00::/8"
type CIDR string

// PortNumber is a TCP port.
// +kubebuilder:validation:Minimum=1
// +kubebuilder:validation:Maximum=65535
type PortNumber int32

// CloudInit references the Secret key holding an instance's boot configuration.
type CloudInit struct {
	// SecretRef names the Secret (in the Proxy's namespace) and the key to read.
	SecretRef SecretKeyRef `json:"secretRef"`
}

// SecretKeyRef selects a key of a Secret in the Proxy's namespace.
type SecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// HealthCheck configures the probe sent through the proxy.
// +kubebuilder:validation:XValidation:rule="duration(self.timeout) < duration(self.interval)",message="healthCheck.timeout must be shorter than healthCheck.interval"
type HealthCheck struct {
	// URL is fetched through the proxy: for https, a CONNECT tunnel and TLS inside it.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="healthCheck.url must be an absolute http or https URL"
	URL string `json:"url"`

	// Interval between probes.
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="healthCheck.interval must be at least 1s"
	// +optional
	Interval Duration `json:"interval,omitempty"`

	// Timeout of one probe; shorter than the interval.
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="healthCheck.timeout must be positive"
	// +optional
	Timeout Duration `json:"timeout,omitempty"`

	// SuccessThreshold is how many consecutive successes make an unhealthy proxy healthy.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`

	// FailureThreshold is how many consecutive failures make a healthy proxy unhealthy.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`

	// ExpectedStatus is the HTTP status the target must answer with.
	// +kubebuilder:default=200
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	// +optional
	ExpectedStatus int32 `json:"expectedStatus,omitempty"`
}

// GCPSpec configures a Compute Engine instance. Zone, machine type and image have no
// defaults on purpose: guessing them would create billable VMs of an arbitrary shape.
// +kubebuilder:validation:XValidation:rule="(has(self.externalIP) && !self.externalIP) || (has(self.allowedSourceRanges) && size(self.allowedSourceRanges) > 0)",message="spec.gcp.allowedSourceRanges is required when the instance has an external IP: list the networks crawlers connect from (or set spec.gcp.externalIP to false)"
// +kubebuilder:validation:XValidation:rule="!has(self.subnetwork) || has(self.network) || !has(self.allowedSourceRanges) || size(self.allowedSourceRanges) == 0",message="spec.gcp.network is required with spec.gcp.subnetwork and spec.gcp.allowedSourceRanges: the firewall rule is made on the instance's network"
type GCPSpec struct {
	// Project defaults to the worker's configured project.
	// +kubebuilder:validation:Pattern=`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`
	// +optional
	Project string `json:"project,omitempty"`

	// Zone such as us-central1-a.
	// +kubebuilder:validation:Pattern=`^[a-z]+-[a-z]+[0-9]+-[a-z]$`
	Zone string `json:"zone"`

	// MachineType such as e2-micro.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	MachineType string `json:"machineType"`

	// Image is the boot image, e.g. projects/debian-cloud/global/images/family/debian-12.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`

	// Network defaults to the project's default network.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Network string `json:"network,omitempty"`

	// Subnetwork, for custom-mode networks.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Subnetwork string `json:"subnetwork,omitempty"`

	// ExternalIP gives the instance a public address (the default). Set it to false when
	// crawlers reach the proxy inside the VPC; the status then carries the internal address.
	// +kubebuilder:default=true
	// +optional
	ExternalIP *bool `json:"externalIP,omitempty"`

	// AllowedSourceRanges are the networks crawlers connect from. The provider keeps a
	// firewall rule, shared by the instances with the same network, ranges and port, that
	// admits the proxy port from these alone; every other source is dropped before it
	// reaches Squid. Required with an external IP.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedSourceRanges []CIDR `json:"allowedSourceRanges,omitempty"`

	// Tags are network tags (they select firewall rules).
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Tags []NetworkTag `json:"tags,omitempty"`

	// Spot runs the proxy on a Spot VM: far cheaper, and Compute Engine may stop it at any
	// moment to take the capacity back. A proxy is stateless and replaceable, so that costs
	// a new instance and a new IP: a preempted instance is replaced as soon as it is
	// noticed (with no make-before-break, since the old one is already gone), and the
	// Proxy's status and workflow say "preempted".
	// +optional
	Spot bool `json:"spot,omitempty"`

	// Labels are added to the instance beside the ownership labels, which they cannot
	// override.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 63 && k.matches('^[a-z][-_a-z0-9]*$') && !k.startsWith('proxyfleet-'))",message="gcp.labels keys must be 1-63 lowercase letters, digits, '-' or '_', start with a letter, and not start with the reserved prefix proxyfleet-"
	// +optional
	Labels map[string]GCPLabelValue `json:"labels,omitempty"`
}

// NetworkTag is a GCP network tag.
// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
// +kubebuilder:validation:MaxLength=63
type NetworkTag string

// GCPLabelValue is a GCP label value.
// +kubebuilder:validation:Pattern=`^[-_a-z0-9]*$`
// +kubebuilder:validation:MaxLength=63
type GCPLabelValue string

// AWSSpec configures an EC2 instance. Only the region is required: the defaults are the
// smallest general-purpose type and Debian 12's current image, the shape most proxies need.
// +kubebuilder:validation:XValidation:rule="(has(self.associatePublicIP) && !self.associatePublicIP) || (has(self.allowedSourceRanges) && size(self.allowedSourceRanges) > 0)",message="spec.aws.allowedSourceRanges is required when the instance has a public IP: list the networks crawlers connect from (or set spec.aws.associatePublicIP to false)"
type AWSSpec struct {
	// Region such as eu-west-1. The instance runs there; the worker's sweep of orphaned
	// instances looks in the worker's own region (--aws-region) alone.
	// +kubebuilder:validation:Pattern=`^[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}$`
	// +kubebuilder:validation:MaxLength=32
	Region string `json:"region"`

	// InstanceType such as t3.micro (the default) or t4g.nano (Arm: give an arm64 ami).
	// +kubebuilder:default="t3.micro"
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9-]*\.[a-z0-9]+$`
	// +kubebuilder:validation:MaxLength=64
	// +optional
	InstanceType string `json:"instanceType,omitempty"`

	// AMI is the boot image: an image ID (ami-…) or the name of an SSM parameter holding
	// one, such as Debian 12's public /aws/service/debian/release/12/latest/amd64 (the
	// default). EC2 resolves a parameter at each launch, so new instances boot the image
	// current then. The image must be Debian-like (apt installs Squid at boot).
	// +kubebuilder:default="/aws/service/debian/release/12/latest/amd64"
	// +kubebuilder:validation:MaxLength=1011
	// +kubebuilder:validation:XValidation:rule="self.matches('^ami-([0-9a-f]{8}|[0-9a-f]{17})$') || self.matches('^(/[A-Za-z0-9_.-]+)+$')",message="spec.aws.ami must be an image ID such as ami-0123456789abcdef0 or an SSM parameter name starting with '/', such as /aws/service/debian/release/12/latest/amd64"
	// +optional
	AMI string `json:"ami,omitempty"`

	// SubnetID is the subnet of the instance's network interface; empty is the default
	// subnet of the region's default VPC.
	// +kubebuilder:validation:Pattern=`^subnet-([0-9a-f]{8}|[0-9a-f]{17})$`
	// +optional
	SubnetID string `json:"subnetID,omitempty"`

	// AssociatePublicIP gives the instance a public address (the default), which the Proxy
	// serves on. Set it to false when crawlers reach the proxy inside the VPC; the status
	// then carries the private address.
	// +kubebuilder:default=true
	// +optional
	AssociatePublicIP *bool `json:"associatePublicIP,omitempty"`

	// AllowedSourceRanges are the networks crawlers connect from. The provider keeps a
	// security group, shared by the instances with the same VPC, ranges and port, that
	// admits the proxy port from these alone. Required with a public IP. Without them a
	// private instance gets only spec.aws.securityGroupIDs (or the VPC's default group).
	// +kubebuilder:validation:MaxItems=50
	// +listType=set
	// +optional
	AllowedSourceRanges []CIDR `json:"allowedSourceRanges,omitempty"`

	// SecurityGroupIDs are groups of your own added to the instance's interface beside the
	// provider's (EC2 allows five in all).
	// +kubebuilder:validation:MaxItems=4
	// +listType=set
	// +optional
	SecurityGroupIDs []SecurityGroupID `json:"securityGroupIDs,omitempty"`

	// InstanceProfile is an IAM instance profile (its name or ARN) for the instance. None
	// by default: a proxy needs no AWS permissions, and anything a crawler can reach
	// through it should not hold any.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(arn:aws[a-z-]*:iam::[0-9]{12}:instance-profile/.+|[A-Za-z0-9+=,.@_-]{1,128})$`
	// +optional
	InstanceProfile string `json:"instanceProfile,omitempty"`

	// Spot runs a one-time Spot instance: far cheaper, and EC2 may take it back at any
	// moment (it is terminated then). The Proxy's status and workflow say "preempted" and
	// a new instance is made at once.
	// +optional
	Spot bool `json:"spot,omitempty"`

	// Tags are added to the instance and its volume beside the ownership tags, which they
	// cannot override.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) >= 1 && size(k) <= 128 && !k.startsWith('proxyfleet-') && !k.lowerAscii().startsWith('aws:') && k != 'Name')",message="aws.tags keys must be 1-128 characters and not start with the reserved prefixes proxyfleet- or aws: (in any case), nor be Name (the provider names each instance)"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 256)",message="aws.tags values must be at most 256 characters"
	// +optional
	Tags map[string]string `json:"tags,omitempty"`
}

// SecurityGroupID is an EC2 security group ID.
// +kubebuilder:validation:Pattern=`^sg-([0-9a-f]{8}|[0-9a-f]{17})$`
type SecurityGroupID string

// KubernetesSpec configures a Squid pod.
type KubernetesSpec struct {
	// Image of the pod; Squid listening on spec.port.
	// +kubebuilder:default="ubuntu/squid:6.6-24.04_beta"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// Namespace the pod runs in; defaults to the Proxy's namespace.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// Resources of the Squid container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// AllowedClients are who may connect to the Squid pod. The provider keeps a
	// NetworkPolicy beside the pod that admits the proxy port from these peers (and from
	// the worker, whose probes must get through) and nothing else. Empty admits the pods of
	// the Proxy's own namespace. Enforced only where the cluster's network plugin enforces
	// NetworkPolicies.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	AllowedClients []networkingv1.NetworkPolicyPeer `json:"allowedClients,omitempty"`
}

// LocalSpec configures a forward proxy run by the local proxy host on 127.0.0.1. It has no
// fields yet; the block exists so a Managed proxy always names its provider's settings.
type LocalSpec struct{}

// Lifecycle sets automatic replacement of a Managed proxy.
// +kubebuilder:validation:XValidation:rule="!has(self.banWindow) || has(self.banReplaceTargets)",message="lifecycle.banWindow needs lifecycle.banReplaceTargets"
type Lifecycle struct {
	// MaxAge replaces the instance once it is this old (at least 10m).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10m')",message="lifecycle.maxAge must be at least 10m"
	// +optional
	MaxAge *Duration `json:"maxAge,omitempty"`

	// BanReplaceTargets replaces the instance when crawlers report it banned on this many
	// distinct targets within BanWindow. At most 256: a workflow remembers that many bans.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	// +optional
	BanReplaceTargets *int32 `json:"banReplaceTargets,omitempty"`

	// BanWindow is how far back ban reports count (default 1h).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="lifecycle.banWindow must be at least 1m"
	// +optional
	BanWindow *Duration `json:"banWindow,omitempty"`

	// UnhealthyReplaceAfter replaces an instance that stayed unhealthy this long. Off when
	// unset.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('30s')",message="lifecycle.unhealthyReplaceAfter must be at least 30s"
	// +optional
	UnhealthyReplaceAfter *Duration `json:"unhealthyReplaceAfter,omitempty"`
}

// Phase summarises where a Proxy is in its life.
type Phase string

// Phases, in the order a Managed proxy normally goes through them.
const (
	PhasePending      Phase = "Pending"
	PhaseProvisioning Phase = "Provisioning"
	PhaseReady        Phase = "Ready"
	PhaseUnhealthy    Phase = "Unhealthy"
	PhaseReplacing    Phase = "Replacing"
	PhaseDeleting     Phase = "Deleting"
	PhaseFailed       Phase = "Failed"
)

// Condition types.
const (
	// ConditionProvisioned is True while an instance (or the External endpoint) exists
	// with an address.
	ConditionProvisioned = "Provisioned"
	// ConditionHealthy is True while probes through the proxy succeed.
	ConditionHealthy = "Healthy"
	// ConditionQuotaExceeded is True while the provider refuses for quota; it is a wait,
	// never a failure.
	ConditionQuotaExceeded = "QuotaExceeded"
	// ConditionReady is True when the proxy is provisioned and healthy: it can be leased.
	ConditionReady = "Ready"
	// ConditionReplacementPending is a pool member's only: True while its workflow wants to
	// replace its instance on its own account (maxAge, the unhealthy grace, bans) and
	// waits for its pool to allow it within maxSurge. The reason says what asked.
	ConditionReplacementPending = "ReplacementPending"
)

// Condition reasons.
const (
	ReasonPending          = "Pending"
	ReasonProvisioning     = "Provisioning"
	ReasonInstanceRunning  = "InstanceRunning"
	ReasonExternalEndpoint = "ExternalEndpoint"
	ReasonReplacing        = "Replacing"
	ReasonDeleting         = "Deleting"
	ReasonProviderError    = "ProviderError"
	ReasonPermanentError   = "PermanentError"
	ReasonCloudInitError   = "CloudInitError"
	ReasonQuotaExceeded    = "QuotaExceeded"
	ReasonQuotaAvailable   = "QuotaAvailable"
	ReasonProbeSucceeded   = "ProbeSucceeded"
	ReasonProbeFailed      = "ProbeFailed"
	// ReasonCredentialsNotLabelled: an External proxy's credentials Secret lacks the label
	// LabelProxyCredentials=true, so it is not read and nothing is sent to the endpoint.
	ReasonCredentialsNotLabelled = "CredentialsNotLabelled"
	// ReasonPreempted: the cloud took the instance back (a Spot VM); it is being replaced.
	ReasonPreempted = "Preempted"
	ReasonNotProbed = "NotProbed"
	ReasonReady     = "Ready"
	ReasonNotReady  = "NotReady"

	// Reasons of ConditionReplacementPending: what asked for the replacement that waits,
	// or (False) that none does.
	ReasonMaxAge         = "MaxAge"
	ReasonUnhealthyGrace = "UnhealthyGrace"
	ReasonBanned         = "Banned"
	ReasonCloudInit      = "CloudInitRotated"
	ReasonNoneWanted     = "NoneWanted"

	// ReasonHealthCheckTargetDown: the health check's URL fails through most of the
	// proxies probing it at once, so its failures say nothing about this proxy. The last
	// verdict is kept (a healthy proxy stays leasable and is not replaced) until the target
	// answers again.
	ReasonHealthCheckTargetDown = "HealthCheckTargetDown"
)

// ProxyStatus is written only by the Proxy's workflow, through an activity.
type ProxyStatus struct {
	// Phase summarises the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// IP is the address crawlers connect to.
	// +optional
	IP string `json:"ip,omitempty"`
	// Port is the port crawlers connect to.
	// +optional
	Port int32 `json:"port,omitempty"`
	// InstanceName is the provider-side name of the current instance.
	// +optional
	InstanceName string `json:"instanceName,omitempty"`
	// ProviderID identifies the current instance to its provider.
	// +optional
	ProviderID string `json:"providerID,omitempty"`
	// Replacements counts instances replaced over the Proxy's life.
	// +optional
	Replacements int32 `json:"replacements,omitempty"`
	// RetiringInstances counts the instances given up and not deleted yet: they cost
	// money until they are, and a pool counts them against its maxSurge.
	// +optional
	RetiringInstances int32 `json:"retiringInstances,omitempty"`
	// LatencyMillis is the median latency of the last 5 successful probes, as last
	// recorded (latency alone is recorded at most every 10 minutes).
	// +optional
	LatencyMillis int64 `json:"latencyMillis,omitempty"`
	// LastHealthCheckTime is when the last recorded probe ran. Probes that change nothing
	// are not recorded; their recency is in the worker's metrics.
	// +optional
	LastHealthCheckTime *metav1.Time `json:"lastHealthCheckTime,omitempty"`
	// ObservedGeneration is the spec generation the workflow has applied.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// WorkflowID is the Temporal workflow that owns this Proxy.
	// +optional
	WorkflowID string `json:"workflowID,omitempty"`
	// Conditions: Provisioned, Healthy, QuotaExceeded, Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Proxy is one egress proxy for crawlers: a Managed instance this system runs, or an
// External endpoint it only probes and offers.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=px,categories=crawl
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`
// +kubebuilder:printcolumn:name="Latency",type=integer,JSONPath=`.status.latencyMillis`,description="median latency of recent probes, in milliseconds"
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxySpec   `json:"spec"`
	Status ProxyStatus `json:"status,omitempty"`
}

// ProxyList is a list of Proxies.
//
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}
