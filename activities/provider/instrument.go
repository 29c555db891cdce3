package provider

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Metrics count provider calls. One set serves every provider of a worker.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics creates and registers the provider metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_provider_requests_total",
			Help: "Provider calls by provider, operation and result (ok, not_found, transient, quota, permanent).",
		}, []string{"provider", "op", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_provider_request_duration_seconds",
			Help:    "Provider call latency by provider and operation.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"provider", "op"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// Instrument wraps p so every call is counted, timed and traced as a client span. Spans
// carry names and IDs (provider, installation, Proxy UID, instance, result) only: never a request's
// cloud-init data.
func Instrument(name v1alpha1.Provider, p Provider, m *Metrics) Provider {
	return &instrumented{name: string(name), p: p, m: m, tracer: otel.Tracer("github.com/proxyfleet/proxyfleet/activities/provider")}
}

type instrumented struct {
	name   string
	p      Provider
	m      *Metrics
	tracer trace.Tracer
}

func (i *instrumented) observe(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := i.tracer.Start(ctx, "provider."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, attribute.String("proxyfleet.provider", i.name))...))
	return ctx, func(err error) {
		result := "ok"
		switch {
		case err == nil:
		case errors.Is(err, ErrNotFound):
			result = "not_found"
		default:
			result = Class(err).String()
			span.SetStatus(codes.Error, result)
			span.RecordError(err)
		}
		span.SetAttributes(attribute.String("proxyfleet.result", result))
		span.End()
		if i.m != nil {
			i.m.requests.WithLabelValues(i.name, op, result).Inc()
			i.m.duration.WithLabelValues(i.name, op).Observe(time.Since(start).Seconds())
		}
	}
}

func (i *instrumented) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	ctx, done := i.observe(ctx, "create", attribute.String("proxyfleet.instance", req.Name))
	inst, err := i.p.Create(ctx, req)
	done(err)
	return inst, err
}

func (i *instrumented) Get(ctx context.Context, id string) (Instance, error) {
	ctx, done := i.observe(ctx, "get", attribute.String("proxyfleet.provider_id", id))
	inst, err := i.p.Get(ctx, id)
	done(err)
	return inst, err
}

func (i *instrumented) Delete(ctx context.Context, id string) error {
	ctx, done := i.observe(ctx, "delete", attribute.String("proxyfleet.provider_id", id))
	err := i.p.Delete(ctx, id)
	done(err)
	return err
}

func (i *instrumented) ListOwned(ctx context.Context, owner Owner) ([]Instance, error) {
	attrs := []attribute.KeyValue{attribute.String("proxyfleet.installation", owner.Installation)}
	if owner.ProxyUID != "" {
		// Tells a workflow's list of its own instances apart from the sweeper's.
		attrs = append(attrs, attribute.String("proxyfleet.proxy_uid", owner.ProxyUID))
	}
	ctx, done := i.observe(ctx, "list", attrs...)
	list, err := i.p.ListOwned(ctx, owner)
	done(err)
	return list, err
}

func (i *instrumented) ProviderID(req CreateRequest) string { return i.p.ProviderID(req) }

// InstrumentAll wraps every provider of r.
func InstrumentAll(r Registry, m *Metrics) Registry {
	out := make(Registry, len(r))
	for name, p := range r {
		out[name] = Instrument(name, p, m)
	}
	return out
}
