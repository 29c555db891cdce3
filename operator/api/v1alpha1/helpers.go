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

	// Finalizer keeps a Proxy until its workflow has deleted the instance.
	Finalizer = "crawl.example.com/instance"
)

// Defaults applied in code where the schema cannot default (optional blocks).
const (
	DefaultBanWindow = time.Hour
)

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
