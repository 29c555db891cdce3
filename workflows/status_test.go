package workflows

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestPhase(t *testing.T) {
	managed := &v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}
	desired := DesiredHash(managed, "")
	run := &InstanceRef{Name: "a", Hash: desired, Created: true, State: provider.StateRunning, IP: "1.2.3.4"}
	cases := []struct {
		name  string
		state ProxyState
		want  v1alpha1.Phase
	}{
		{"nothing yet", ProxyState{}, v1alpha1.PhasePending},
		{"spec, nothing tried", ProxyState{Spec: managed}, v1alpha1.PhasePending},
		{"creating", ProxyState{Spec: managed, Counter: 1, Instance: &InstanceRef{Name: "a"}}, v1alpha1.PhaseProvisioning},
		{"quota wait is provisioning, not failed", ProxyState{Spec: managed, Quota: "no CPUs"}, v1alpha1.PhaseProvisioning},
		{"running without verdict", ProxyState{Spec: managed, Counter: 1, Instance: run}, v1alpha1.PhaseProvisioning},
		{"healthy", ProxyState{Spec: managed, Counter: 1, Instance: run, Health: activities.Health{Known: true, Healthy: true}}, v1alpha1.PhaseReady},
		{"unhealthy", ProxyState{Spec: managed, Counter: 1, Instance: run, Health: activities.Health{Known: true}}, v1alpha1.PhaseUnhealthy},
		{"replacing", ProxyState{Spec: managed, Counter: 2, Instance: run, Next: &InstanceRef{Name: "b"}, Health: activities.Health{Known: true, Healthy: true}}, v1alpha1.PhaseReplacing},
		{"failed", ProxyState{Spec: managed, Generation: 2, Failure: &Failure{Generation: 2}}, v1alpha1.PhaseFailed},
		{"deleting", ProxyState{Spec: managed, Deleting: true}, v1alpha1.PhaseDeleting},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			assert.Equal(t, tc.want, phase(&s))
		})
	}
}

// TestProvisionedCondition: what stands in the way of an instance is named, most telling
// first, and deleting or replacing says what the Proxy does instead.
func TestProvisionedCondition(t *testing.T) {
	managed := managedSpec()
	run := runningRef("a", managed)
	cases := []struct {
		name           string
		state          ProxyState
		status, reason string
		message        string
	}{
		{"no spec", ProxyState{}, "False", v1alpha1.ReasonPending, "waiting for the first spec"},
		{"external", ProxyState{Spec: externalSpec()}, "True", v1alpha1.ReasonExternalEndpoint, "external endpoint h:1"},
		{"running", ProxyState{Spec: managed, Instance: run}, "True", v1alpha1.ReasonInstanceRunning, "instance a is running"},
		{"failure latched", ProxyState{Spec: managed, Generation: 2, Failure: &Failure{Generation: 2, Message: "bad image"}, Quota: "q"},
			"False", v1alpha1.ReasonPermanentError, "bad image"},
		{"failure of an older generation is not", ProxyState{Spec: managed, Generation: 3, Failure: &Failure{Generation: 2, Message: "bad image"}},
			"False", v1alpha1.ReasonPending, "waiting for the first spec"},
		{"cloud-init before quota", ProxyState{Spec: managed, CloudInitError: "no key", Quota: "q"}, "False", v1alpha1.ReasonCloudInitError, "no key"},
		{"quota before provider error", ProxyState{Spec: managed, Quota: "no CPUs", LastError: "x"}, "False", v1alpha1.ReasonQuotaExceeded, "no CPUs"},
		{"provider error", ProxyState{Spec: managed, LastError: "503"}, "False", v1alpha1.ReasonProviderError, "503"},
		{"waiting for an address", ProxyState{Spec: managed, Instance: &InstanceRef{Name: "a", Created: true}},
			"False", v1alpha1.ReasonProvisioning, "waiting for instance a to be running"},
		{"deleting wins over running", ProxyState{Spec: managed, Instance: run, Deleting: true}, "False", v1alpha1.ReasonDeleting, "deleting the instance"},
		{"replacing keeps True and names both", ProxyState{Spec: managed, Instance: run, Next: &InstanceRef{Name: "b"}},
			"True", v1alpha1.ReasonReplacing, "instance a serves while its replacement is built (b)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			c := provisionedCondition(&s, phase(&s))
			assert.Equal(t, v1alpha1.ConditionProvisioned, c.Type)
			assert.Equal(t, tc.status, string(c.Status))
			assert.Equal(t, tc.reason, c.Reason)
			assert.Equal(t, tc.message, c.Message)
		})
	}
}

// TestHealthyCondition: the reason is the probes' unless the verdict names another
// (credentials that may not be used, a health-check target that is down) or the instance
// was preempted; the message leads with the failure kind; a target that is down makes a
// healthy verdict Unknown, never False.
func TestHealthyCondition(t *testing.T) {
	down := v1alpha1.ReasonHealthCheckTargetDown
	cases := []struct {
		name                  string
		health                activities.Health
		status, reason, start string
	}{
		{"no verdict", activities.Health{}, "Unknown", v1alpha1.ReasonNotProbed, "no verdict"},
		{"no verdict, target down", activities.Health{FailureReason: down, LastFailure: "target refused"}, "Unknown", down, "target refused"},
		{"healthy", activities.Health{Known: true, Healthy: true, LatencyMillis: 12}, "True", v1alpha1.ReasonProbeSucceeded, "probes through the proxy succeed (12ms)"},
		{"healthy, target down", activities.Health{Known: true, Healthy: true, FailureReason: down, LastFailure: "target refused"}, "Unknown", down, "target refused"},
		{"a probe failed", activities.Health{Known: true, LastFailure: "proxy asks for authentication (407)", FailureKind: probe.KindProxyAuth},
			"False", v1alpha1.ReasonProbeFailed, "proxy_auth: proxy asks"},
		{"credentials that may not be used", activities.Health{Known: true, LastFailure: "credentials Secret ns/s lacks the label",
			FailureKind: probe.KindProxyAuth, FailureReason: v1alpha1.ReasonCredentialsNotLabelled},
			"False", v1alpha1.ReasonCredentialsNotLabelled, "proxy_auth: credentials Secret ns/s lacks the label"},
		{"preempted", activities.Health{Known: true, LastFailure: "instance " + LostPreempted}, "False", v1alpha1.ReasonPreempted, "the provider took the instance back"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := healthyCondition(tc.health)
			assert.Equal(t, v1alpha1.ConditionHealthy, c.Type)
			assert.Equal(t, tc.status, string(c.Status))
			assert.Equal(t, tc.reason, c.Reason)
			assert.True(t, strings.HasPrefix(c.Message, tc.start), "message %q", c.Message)
		})
	}
}

// TestQuotaCondition: True with the provider's words while a quota wait lasts.
func TestQuotaCondition(t *testing.T) {
	c := quotaCondition("CPUS exceeded in europe-west1")
	assert.Equal(t, metav1.ConditionTrue, c.Status)
	assert.Equal(t, v1alpha1.ReasonQuotaExceeded, c.Reason)
	assert.Equal(t, "CPUS exceeded in europe-west1", c.Message)
	c = quotaCondition("")
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, v1alpha1.ReasonQuotaAvailable, c.Reason)
}

// TestReadyCondition: Ready is provisioned and healthy, or provisioned with a healthy
// verdict held through the health-check target's outage; never while deleting.
func TestReadyCondition(t *testing.T) {
	yes := metav1.Condition{Status: metav1.ConditionTrue}
	no := metav1.Condition{Status: metav1.ConditionFalse}
	unknown := metav1.Condition{Status: metav1.ConditionUnknown}
	held := activities.Health{Known: true, Healthy: true, FailureReason: v1alpha1.ReasonHealthCheckTargetDown}
	cases := []struct {
		name                 string
		provisioned, healthy metav1.Condition
		health               activities.Health
		deleting             bool
		status, message      string
	}{
		{"provisioned and healthy", yes, yes, activities.Health{Known: true, Healthy: true}, false, "True", "provisioned and healthy"},
		{"held through the target's outage", yes, unknown, held, false, "True", "provisioned, and healthy when its health-check target last answered"},
		{"unhealthy", yes, no, activities.Health{Known: true}, false, "False", "phase Ready"},
		{"not provisioned", no, yes, activities.Health{Known: true, Healthy: true}, false, "False", "phase Ready"},
		{"no verdict while the target is down", yes, unknown, activities.Health{FailureReason: v1alpha1.ReasonHealthCheckTargetDown}, false, "False", "phase Ready"},
		{"deleting", yes, yes, activities.Health{Known: true, Healthy: true}, true, "False", "phase Ready"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := readyCondition(v1alpha1.PhaseReady, tc.provisioned, tc.healthy, tc.health, tc.deleting)
			assert.Equal(t, v1alpha1.ConditionReady, c.Type)
			assert.Equal(t, tc.status, string(c.Status))
			assert.Equal(t, tc.message, c.Message)
		})
	}
}

// TestStatusHasTheFourConditionsInOrder: kubectl and the tests read conditions by type,
// but the order is what earlier runs wrote, and a reorder would rewrite every status.
func TestStatusHasTheFourConditionsInOrder(t *testing.T) {
	s := steadyState()
	st := status(&s, "wf")
	var types []string
	for _, c := range st.Conditions {
		types = append(types, c.Type)
	}
	assert.Equal(t, []string{v1alpha1.ConditionProvisioned, v1alpha1.ConditionHealthy, v1alpha1.ConditionQuotaExceeded, v1alpha1.ConditionReady}, types)
	assert.Equal(t, "127.0.0.1", st.IP)
	assert.Equal(t, "a", st.InstanceName)
}
