package observability

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestOneTraceFromControllerToActivities records spans in memory while a Proxy with a
// cloud-init Secret is provisioned: the controller's reconcile, the workflow and its
// activities share one trace; a discovery request continues an incoming traceparent; and
// the Secret's canary appears in no span.
func TestOneTraceFromControllerToActivities(t *testing.T) {
	spans, tc := e2e.Traced(t)
	s := stack.Start(t, stack.Options{Client: tc})

	ctx := context.Background()
	ns := s.Namespace(t)
	canary := fmt.Sprintf("trace-canary-%d", time.Now().UnixNano())
	require.NoError(t, s.Kube.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"script": []byte(canary)},
	}))
	p := stack.Tagged(s.LocalProxy(ns, "traced"), ns)
	p.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "script"}}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	s.WaitFor(t, ns, "traced", time.Minute, "Ready", stack.Ready)

	// A crawler's request with its own trace context.
	d := s.StartDiscovery(t)
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	req, err := http.NewRequest(http.MethodGet, d.URL+"/v1/proxies?attr.run="+ns, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+d.Token)
	req.Header.Set("traceparent", fmt.Sprintf("00-%s-%s-01", parent.TraceID(), parent.SpanID()))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The reconcile that started the workflow roots a trace holding the workflow's and the
	// activities' spans, down to the provider call.
	var got tracetest.SpanStubs
	require.Eventually(t, func() bool {
		got = spans.GetSpans()
		for _, root := range got {
			if root.Name != "Reconcile Proxy" {
				continue
			}
			names := map[string]bool{}
			for _, sp := range got {
				if sp.SpanContext.TraceID() == root.SpanContext.TraceID() {
					names[sp.Name] = true
				}
			}
			// (The workflow's own RunWorkflow span is exported when the workflow ends.)
			if names["SignalWithStartWorkflow:ProxyWorkflow"] && names["HandleSignal:spec"] &&
				names["StartActivity:CreateInstance"] && names["RunActivity:CreateInstance"] && names["provider.create"] {
				return true
			}
		}
		return false
	}, 30*time.Second, 200*time.Millisecond, "no trace from the controller through the workflow to the provider")

	var server *tracetest.SpanStub
	for i, sp := range got {
		if sp.SpanKind == trace.SpanKindServer && sp.SpanContext.TraceID() == parent.TraceID() {
			server = &got[i]
		}
	}
	require.NotNil(t, server, "discovery did not continue the incoming trace")
	assert.Equal(t, parent.SpanID(), server.Parent.SpanID())
	assert.Equal(t, "/v1/proxies", server.Name[strings.Index(server.Name, "/"):])

	for _, sp := range spans.GetSpans() {
		for _, a := range sp.Attributes {
			assert.NotContains(t, a.Value.String(), canary, "span %s attribute %s", sp.Name, a.Key)
		}
		for _, ev := range sp.Events {
			for _, a := range ev.Attributes {
				assert.NotContains(t, a.Value.String(), canary, "span %s event %s", sp.Name, ev.Name)
			}
		}
		assert.NotContains(t, sp.Status.Description, canary)
	}
}
