package v1alpha1

import (
	"fmt"
	"time"
)

// Labels and finalizers the system puts on objects it owns or reads.
const (
	// LabelCloudInit marks Secrets the operator may read as cloud-init. Only Secrets with
	// this label set to "true" are cached, so the operator never holds every Secret.
	LabelCloudInit = "crawl.example.com/cloud-init"

	// LabelProxyCredentials marks Secrets the worker may read as an External proxy's
	// credentials (spec.endpoint.credentialsSecretRef) and send to the endpoint the Proxy
	// names. Only Secrets with this label set to "true" are read: without it, whoever may
	// create a Proxy could have any Secret with username and password keys sent to an
	// address of their choosing.
	LabelProxyCredentials = "crawl.example.com/proxy-credentials"

	// Finalizer keeps a Proxy until its workflow has deleted the instance.
	Finalizer = "crawl.example.com/instance"
)

// Defaults applied in code where the schema cannot default (optional blocks).
const (
	DefaultBanWindow = time.Hour
)

// Health-check defaults. The schema applies the same values to every Proxy the API server
// stores (the +kubebuilder:default markers on HealthCheck; a test checks they agree); code
// applies them to specs built without it, such as a workflow's input in a unit test.
const (
	DefaultHealthCheckInterval = 10 * time.Second
	DefaultHealthCheckTimeout  = 5 * time.Second
	DefaultSuccessThreshold    = 2
	DefaultFailureThreshold    = 3
	DefaultExpectedStatus      = 200
	// DefaultMaxLeases is the schema's default of spec.maxLeases.
	DefaultMaxLeases = 4
)

// ProviderLabelExternal is ProviderLabel for External proxies, which have no provider.
const ProviderLabelExternal = "external"

// ProviderLabel names where the proxy runs in metrics, search attributes and discovery's
// memo: its provider, or "external".
func (s *ProxySpec) ProviderLabel() string {
	if s.EffectiveMode() == ModeExternal {
		return ProviderLabelExternal
	}
	return string(s.Provider)
}

// EffectiveInterval is the probe interval, with the default when unset.
func (h HealthCheck) EffectiveInterval() (time.Duration, error) {
	return h.Interval.ParseDuration(DefaultHealthCheckInterval)
}

// EffectiveTimeout is the probe timeout, with the default when unset.
func (h HealthCheck) EffectiveTimeout() (time.Duration, error) {
	return h.Timeout.ParseDuration(DefaultHealthCheckTimeout)
}

// EffectiveThresholds are the success and failure thresholds, with defaults when unset.
func (h HealthCheck) EffectiveThresholds() (success, failure int) {
	return orDefault(int(h.SuccessThreshold), DefaultSuccessThreshold), orDefault(int(h.FailureThreshold), DefaultFailureThreshold)
}

// EffectiveExpectedStatus is the status the target must answer, with the default when unset.
func (h HealthCheck) EffectiveExpectedStatus() int {
	return orDefault(int(h.ExpectedStatus), DefaultExpectedStatus)
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// ParseDuration parses a Duration validated by the schema. An empty value yields def.
func (d Duration) ParseDuration(def time.Duration) (time.Duration, error) {
	if d == "" {
		return def, nil
	}
	v, err := time.ParseDuration(string(d))
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: %w", string(d), err)
	}
	return v, nil
}

// EffectiveMode is the mode with the schema default applied, for objects built in code.
func (s *ProxySpec) EffectiveMode() Mode {
	if s.Mode == "" {
		return ModeManaged
	}
	return s.Mode
}

// EffectivePort is the port crawlers connect to: the endpoint's for External proxies, the
// instance's (default 3128) for Managed ones.
func (s *ProxySpec) EffectivePort() int32 {
	if s.EffectiveMode() == ModeExternal && s.Endpoint != nil {
		return s.Endpoint.Port
	}
	if s.Port == 0 {
		return DefaultManagedPort
	}
	return s.Port
}
