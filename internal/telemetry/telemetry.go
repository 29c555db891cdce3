// Package telemetry wires OpenTelemetry tracing and the Temporal SDK's metrics the same way
// in every binary. Tracing is configured by the standard OTEL_* environment variables only:
// with no exporter configured no SDK is installed, spans are no-ops, and nothing changes.
// Trace context is always propagated (W3C traceparent), so a trace started by a caller
// continues through whichever parts do record spans.
package telemetry

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
)

// Enabled reports whether the environment asks for traces to be exported.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if v := os.Getenv("OTEL_TRACES_EXPORTER"); v != "" {
		return v != "none"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// SetupTracing installs a tracer provider exporting as the OTEL_* variables say, or none
// when they say nothing. The returned function flushes and stops it.
func SetupTracing(ctx context.Context, service string) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// TemporalInterceptor propagates traces through Temporal: a client call's span becomes the
// parent of the workflow's, whose activities' spans are its children. It uses the global
// tracer provider, so it is a no-op when tracing is off.
func TemporalInterceptor() (interceptor.Interceptor, error) {
	return temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{})
}

// TemporalMetrics returns a handler that exports the Temporal SDK's metrics (and metrics
// workflows record through workflow.GetMetricsHandler) to reg, with Prometheus naming:
// counters are monotonic, so they are exported as counters with the `_total` suffix (the
// handler's default, up-down counters, made every SDK counter a gauge, and
// temporal_local_activity_total a gauge named like a counter), and each metric carries help
// text, so the endpoint passes `promtool check metrics`.
func TemporalMetrics(reg prometheus.Registerer) (client.MetricsHandler, error) {
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(describeTemporal))
	return temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter: mp.Meter("temporal-sdk"), UseMonotonicCounters: true,
	}), nil
}

// describeTemporal gives the SDK's instruments, which carry no description, their help text.
func describeTemporal(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
	if i.Description != "" {
		return sdkmetric.Stream{}, false
	}
	help, ok := temporalHelp[strings.TrimPrefix(i.Name, "temporal_")]
	if !ok {
		help = "Temporal Go SDK metric " + i.Name + " (see the SDK metrics reference)."
	}
	return sdkmetric.Stream{Name: i.Name, Description: help, Unit: i.Unit}, true
}

// temporalHelp describes the SDK metrics operators read most; the rest get a generic text.
var temporalHelp = map[string]string{
	"request":                                 "Requests this process made to the Temporal frontend.",
	"request_failure":                         "Requests to the Temporal frontend that failed.",
	"request_latency":                         "Latency of requests to the Temporal frontend.",
	"long_request":                            "Long-poll requests to the Temporal frontend.",
	"long_request_failure":                    "Long-poll requests to the Temporal frontend that failed.",
	"long_request_latency":                    "Latency of long-poll requests to the Temporal frontend.",
	"workflow_completed":                      "Workflow runs this worker completed.",
	"workflow_failed":                         "Workflow runs this worker failed.",
	"workflow_canceled":                       "Workflow runs this worker ended as canceled.",
	"workflow_continue_as_new":                "Workflow runs this worker continued as new.",
	"workflow_endtoend_latency":               "Time from a workflow run's start to its close.",
	"workflow_task_schedule_to_start_latency": "Time a workflow task waited in its queue before this worker started it.",
	"workflow_task_execution_latency":         "Time this worker spent executing a workflow task.",
	"workflow_task_replay_latency":            "Time this worker spent replaying history for a workflow task.",
	"workflow_task_execution_failed":          "Workflow tasks that failed on this worker (a non-determinism error among them).",
	"workflow_task_queue_poll_succeed":        "Workflow task polls that returned a task.",
	"workflow_task_queue_poll_empty":          "Workflow task polls that returned nothing.",
	"activity_schedule_to_start_latency":      "Time an activity task waited in its queue before this worker started it.",
	"activity_execution_latency":              "Time this worker spent executing an activity attempt.",
	"activity_succeed_endtoend_latency":       "Time from an activity's scheduling to its success.",
	"activity_execution_failed":               "Activity attempts that failed on this worker.",
	"activity_poll_no_task":                   "Activity task polls that returned nothing.",
	"local_activity_total":                    "Local activities this worker started.",
	"local_activity_execution_failed":         "Local activity attempts that failed on this worker.",
	"local_activity_execution_latency":        "Time this worker spent executing a local activity.",
	"worker_task_slots_available":             "Free task slots on this worker, by worker type.",
	"worker_task_slots_used":                  "Used task slots on this worker, by worker type.",
	"sticky_cache_size":                       "Workflow executions held in this worker's sticky cache.",
	"sticky_cache_hit":                        "Workflow tasks served from this worker's sticky cache.",
	"sticky_cache_miss":                       "Workflow tasks that had to replay history: not in the sticky cache.",
	"num_pollers":                             "Pollers this worker runs, by poller type.",
	"corrupted_signals":                       "Signals this worker could not decode.",
}

// LogHandler adds traceID and spanID to every record logged with a context that carries a
// span, so a log line leads to its trace.
func LogHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (t traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("traceID", sc.TraceID().String()), slog.String("spanID", sc.SpanID().String()))
	}
	return t.Handler.Handle(ctx, r)
}

func (t traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{t.Handler.WithAttrs(as)}
}

func (t traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{t.Handler.WithGroup(name)}
}
