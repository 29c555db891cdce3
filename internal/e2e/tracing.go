package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"

	"github.com/proxyfleet/proxyfleet/internal/telemetry"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// Traced records every span of the test in memory, for this process's OpenTelemetry and a
// Temporal client that traces (the stack's workflows and activities then do too).
func Traced(t *testing.T) (*tracetest.InMemoryExporter, client.Client) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	tracing, err := telemetry.TemporalInterceptor()
	require.NoError(t, err)
	tc, err := client.NewClientFromExisting(testenv.Temporal(t).Client, client.Options{Interceptors: []interceptor.ClientInterceptor{tracing}})
	require.NoError(t, err)
	t.Cleanup(tc.Close)
	return spans, tc
}
