// Package registry builds the provider registry a worker runs with. It is the one place that
// knows every provider package, so the worker binary and the test stack enable providers the
// same way and a provider added here is available to both.
package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	awsprov "github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp"
	"github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Available lists the providers this build can enable.
var Available = []v1alpha1.Provider{v1alpha1.ProviderAWS, v1alpha1.ProviderGCP, v1alpha1.ProviderKubernetes, v1alpha1.ProviderLocal}

// Config says which providers to enable and what each needs.
type Config struct {
	// Enabled lists providers by spec.provider name.
	Enabled []v1alpha1.Provider
	// GCP configures the gcp provider; its DefaultProject is required when gcp is enabled.
	GCP gcp.Config
	// AWS configures the aws provider. Unless its SDK configuration carries credentials
	// (a test's), Build loads the SDK's default chain: the environment, the shared config
	// and credentials files, web identity (IRSA on EKS), the container and instance roles.
	AWS awsprov.Config
	// AWSRegion is the aws provider's default region; empty takes the chain's (AWS_REGION,
	// the shared config's profile). One is required.
	AWSRegion string
	// LocalDaemonURL is the control API of localproxyd, for the local provider.
	LocalDaemonURL string
	// Kube is the cluster the kubernetes provider runs Squid pods in.
	Kube client.Client
	// KubernetesAllow limits the namespaces and images of the kubernetes provider's pods.
	KubernetesAllow kubernetes.Allow
	// KubernetesProbeFrom are the worker's pods as NetworkPolicy peers, admitted to every
	// Squid pod so probes get through (see kubernetes.WorkerPeer).
	KubernetesProbeFrom []networkingv1.NetworkPolicyPeer
	// Metrics counts and times every provider call; nil records none.
	Metrics *provider.Metrics
}

// ParseNames parses a comma-separated list of provider names, such as the worker's
// --providers flag. Empty entries are ignored; unknown names are an error naming them.
func ParseNames(s string) ([]v1alpha1.Provider, error) {
	var out []v1alpha1.Provider
	for _, name := range strings.Split(s, ",") {
		p := v1alpha1.Provider(strings.TrimSpace(name))
		switch {
		case p == "":
		case !slices.Contains(Available, p):
			return nil, unavailable(p)
		case !slices.Contains(out, p):
			out = append(out, p)
		}
	}
	return out, nil
}

// Join lists provider names as help text and logs show them: "gcp, kubernetes, local".
func Join(ps []v1alpha1.Provider) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}

// Build returns the enabled providers, each instrumented, and a function that releases what
// they hold (the GCP client's connections). On error, whatever was built is released.
func Build(ctx context.Context, cfg Config) (_ provider.Registry, _ func(), err error) {
	reg := provider.Registry{}
	var closers []func()
	release := func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	for _, name := range cfg.Enabled {
		switch name {
		case v1alpha1.ProviderLocal:
			reg[name] = local.NewProvider(cfg.LocalDaemonURL)
		case v1alpha1.ProviderKubernetes:
			if cfg.Kube == nil {
				return nil, nil, errors.New("the kubernetes provider needs a Kubernetes client")
			}
			reg[name] = &kubernetes.Provider{Client: cfg.Kube, Allow: cfg.KubernetesAllow, ProbeFrom: cfg.KubernetesProbeFrom}
		case v1alpha1.ProviderAWS:
			c := cfg.AWS
			if c.AWS.Credentials == nil {
				// Nothing is asked of AWS here: credentials are fetched on the first call,
				// so a worker starts (and its other providers work) while AWS is down.
				loaded, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.AWSRegion))
				if err != nil {
					return nil, nil, fmt.Errorf("the aws provider's configuration: %w", err)
				}
				c.AWS = loaded
			} else if cfg.AWSRegion != "" {
				c.AWS.Region = cfg.AWSRegion
			}
			if c.AWS.Region == "" {
				// Without it the sweeper would not know where to look.
				return nil, nil, errors.New("the aws provider needs a region: --aws-region or AWS_REGION")
			}
			a, err := awsprov.New(c)
			if err != nil {
				return nil, nil, err
			}
			reg[name] = a
		case v1alpha1.ProviderGCP:
			if cfg.GCP.DefaultProject == "" {
				// Without it the sweeper would list nothing and leaks would go unnoticed.
				return nil, nil, errors.New("the gcp provider needs --gcp-project")
			}
			g, err := gcp.New(ctx, cfg.GCP)
			if err != nil {
				return nil, nil, err
			}
			closers = append(closers, func() { _ = g.Close() })
			reg[name] = g
		default:
			return nil, nil, unavailable(name)
		}
	}
	return provider.InstrumentAll(reg, cfg.Metrics), release, nil
}

func unavailable(p v1alpha1.Provider) error {
	return fmt.Errorf("%q is not available in this build (available: %s)", p, Join(Available))
}
