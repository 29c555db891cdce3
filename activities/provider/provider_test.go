package provider_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestCreateRequestLabels(t *testing.T) {
	req := provider.CreateRequest{Name: "px-a", ProxyUID: "uid-a", Installation: "inst-a"}
	assert.Equal(t, map[string]string{
		provider.LabelProxyUID:     "uid-a",
		provider.LabelInstallation: "inst-a",
		provider.LabelManagedBy:    provider.ManagedByValue,
	}, req.Labels(), "no hash, no label")

	req.SpecHash = "0123456789abcdef"
	assert.Equal(t, map[string]string{
		provider.LabelProxyUID:     "uid-a",
		provider.LabelInstallation: "inst-a",
		provider.LabelManagedBy:    provider.ManagedByValue,
		provider.LabelSpecHash:     "0123456789abcdef",
	}, req.Labels())
}

func TestOwner(t *testing.T) {
	labels := func(installation, uid string) map[string]string {
		return map[string]string{provider.LabelInstallation: installation, provider.LabelProxyUID: uid}
	}
	tests := []struct {
		name   string
		owner  provider.Owner
		labels map[string]string
		want   bool
	}{
		{"installation", provider.Owner{Installation: "a"}, labels("a", "u1"), true},
		{"other installation", provider.Owner{Installation: "a"}, labels("b", "u1"), false},
		{"unlabelled", provider.Owner{Installation: "a"}, nil, false},
		{"proxy", provider.Owner{Installation: "a", ProxyUID: "u1"}, labels("a", "u1"), true},
		{"other proxy", provider.Owner{Installation: "a", ProxyUID: "u1"}, labels("a", "u2"), false},
		{"proxy in another installation", provider.Owner{Installation: "a", ProxyUID: "u1"}, labels("b", "u1"), false},
		{"no UID label", provider.Owner{Installation: "a", ProxyUID: "u1"}, map[string]string{provider.LabelInstallation: "a"}, false},
		// Nobody's instances: an empty installation owns nothing, even unlabelled ones.
		{"empty owner", provider.Owner{}, map[string]string{provider.LabelInstallation: ""}, false},
		{"empty owner, no labels", provider.Owner{}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.owner.Owns(tc.labels))
		})
	}

	err := provider.Owner{ProxyUID: "u1"}.Check()
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.NoError(t, provider.Owner{Installation: "a"}.Check())

	assert.Equal(t, map[string]string{provider.LabelInstallation: "a"}, provider.Owner{Installation: "a"}.Selector())
	assert.Equal(t, map[string]string{provider.LabelInstallation: "a", provider.LabelProxyUID: "u1"},
		provider.Owner{Installation: "a", ProxyUID: "u1"}.Selector())
}

// lister records the owner it was asked for.
type lister struct {
	provider.Provider
	got []provider.Owner
}

func (l *lister) ListOwned(_ context.Context, owner provider.Owner) ([]provider.Instance, error) {
	l.got = append(l.got, owner)
	return []provider.Instance{{Name: "px-a"}}, nil
}

func TestInstrumentedListOwned(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	inner := &lister{}
	p := provider.Instrument(v1alpha1.ProviderLocal, inner, provider.NewMetrics(prometheus.NewRegistry()))
	owners := []provider.Owner{{Installation: "inst-a"}, {Installation: "inst-a", ProxyUID: "uid-a"}}
	for _, o := range owners {
		list, err := p.ListOwned(t.Context(), o)
		require.NoError(t, err)
		assert.Len(t, list, 1)
	}
	assert.Equal(t, owners, inner.got, "the owner is passed through as given")

	spans := rec.Ended()
	require.Len(t, spans, 2)
	attrs := func(i int) map[attribute.Key]string {
		m := map[attribute.Key]string{}
		for _, kv := range spans[i].Attributes() {
			m[kv.Key] = kv.Value.String()
		}
		return m
	}
	assert.Equal(t, "provider.list", spans[0].Name())
	assert.Equal(t, "inst-a", attrs(0)["proxyfleet.installation"])
	assert.NotContains(t, attrs(0), attribute.Key("proxyfleet.proxy_uid"), "the sweeper's list names no Proxy")
	assert.Equal(t, "inst-a", attrs(1)["proxyfleet.installation"])
	assert.Equal(t, "uid-a", attrs(1)["proxyfleet.proxy_uid"])
}
