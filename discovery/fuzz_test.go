package discovery_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// fuzzBodyLimit is small so the fuzzer reaches the too_large answer.
const fuzzBodyLimit = 512

// refusalStatus is the contract for request bodies: each code a body can be refused with,
// and its status.
var refusalStatus = map[string]int{
	"invalid":          http.StatusBadRequest,
	"invalid_selector": http.StatusBadRequest,
	"too_large":        http.StatusRequestEntityTooLarge,
}

// FuzzDecodeLeaseRequest feeds arbitrary bodies to the strict decoder and the request's
// validation: nothing panics, every refusal is an *APIError with a 400 or 413 code, and an
// accepted request has a valid selector, target and a TTL within (0, MaxTTL].
//
//	go test ./discovery -run '^$' -fuzz '^FuzzDecodeLeaseRequest$' -fuzztime 60s
func FuzzDecodeLeaseRequest(f *testing.F) {
	for _, seed := range []string{
		``,
		`{}`,
		`null`,
		`[]`,
		`{"selector":{"region":"eu","country":"de"},"ttlSeconds":60,"target":"shop.example"}`,
		`{"selector":null,"ttlSeconds":0}`,
		`{"selector":{"Region":"eu"}}`,
		`{"selector":{"region":"e u"}}`,
		`{"selector":{"region":1}}`,
		`{"ttlSeconds":"x"}`,
		`{"ttlSeconds":1.5}`,
		`{"ttlSeconds":-1}`,
		`{"ttlSeconds":3601}`,
		`{"ttlSeconds":9223372037}`,
		`{"ttlSeconds":9223372036854775807}`,
		`{"ttlSeconds":1e400}`,
		`{"target":"a/b"}`,
		`{"ttl":60}`,
		`{"ttlSeconds":60}{}`,
		`{"ttlSeconds":60} x`,
		`{"ttlSeconds":60}` + strings.Repeat(" ", fuzzBodyLimit),
		`{"target":"` + strings.Repeat("a", fuzzBodyLimit) + `"}`,
		`{"selector":{"a":"b","a":"c"}}`,
		`{"selector":{"a":"b"},"selector":{"c":"d"}}`,
		"{\"target\":\"\xff\"}",
		`{"target":"\u0000"}`,
		`{`,
		`"`,
	} {
		f.Add([]byte(seed), true)
	}
	f.Add([]byte(``), false)
	f.Add([]byte(`{}`), false)
	cfg := discovery.Config{DefaultTTL: 5 * time.Minute, MaxTTL: time.Hour}

	f.Fuzz(func(t *testing.T, body []byte, allowEmpty bool) {
		var req discovery.LeaseRequest
		err := discovery.DecodeJSON(http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(body)), fuzzBodyLimit), &req, allowEmpty)
		var d time.Duration
		if err == nil {
			d, err = req.Validate(cfg)
		}
		if err != nil {
			var ae *discovery.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("%T %v: not an *APIError", err, err)
			}
			if _, ok := refusalStatus[ae.Code]; !ok {
				t.Fatalf("code %q is not a refusal of a body (400 or 413): %v", ae.Code, ae)
			}
			if ae.Message == "" {
				t.Fatalf("code %q without a message", ae.Code)
			}
			if ae.NoMatch != nil {
				t.Fatalf("NoMatch on a refused body: %v", ae)
			}
			if ae.Code == "too_large" && len(body) <= fuzzBodyLimit {
				t.Fatalf("too_large for %d bytes", len(body))
			}
			return
		}
		if d <= 0 || d > cfg.MaxTTL {
			t.Fatalf("accepted TTL %v outside (0, %v] from ttlSeconds %d", d, cfg.MaxTTL, req.TTLSeconds)
		}
		if req.TTLSeconds == 0 && d != cfg.DefaultTTL {
			t.Fatalf("no ttlSeconds gave %v, want the default", d)
		}
		if verr := req.Selector.Validate(); verr != nil {
			t.Fatalf("accepted an invalid selector: %v", verr)
		}
		if len(req.Target) > 253 || strings.ContainsAny(req.Target, " \t\r\n/") {
			t.Fatalf("accepted target %q", req.Target)
		}
	})
}

// FuzzParseQuerySelector parses raw query strings: nothing panics, and an accepted selector
// is valid, holds exactly the attr.* parameters, and its Key is canonical and reversible.
//
//	go test ./discovery -run '^$' -fuzz '^FuzzParseQuerySelector$' -fuzztime 60s
func FuzzParseQuerySelector(f *testing.F) {
	for _, seed := range []string{
		``,
		`attr.region=eu`,
		`attr.region=eu&attr.country=de&healthy=true`,
		`attr.region=eu&attr.region=us`,
		`attr.region=eu&attr.region=eu`,
		`attr.Region=eu`,
		`attr.=eu`,
		`attr.region=`,
		`attr.region=e%20u`,
		`attr.region=eu,country=de`,
		`attr.a=b%3Dc`,
		`attr.a.b=c`,
		`attr.attr.a=b`,
		`attr.a-b_c.d=E-f_G.h`,
		`attr.region=eu;attr.country=de`,
		`attr.region=%zz`,
		`attr.` + strings.Repeat("a", 64) + `=x`,
		`attr.k=` + strings.Repeat("v", 64),
		`attr.a=1&attr.b=2&attr.c=3&attr.d=4&attr.e=5&attr.f=6&attr.g=7&attr.h=8&attr.i=9&attr.j=10&attr.k=11` +
			`&attr.l=12&attr.m=13&attr.n=14&attr.o=15&attr.p=16&attr.q=17&attr.r=18&attr.s=19&attr.t=20&attr.u=21` +
			`&attr.v=22&attr.w=23&attr.x=24&attr.y=25&attr.z=26&attr.aa=27&attr.ab=28&attr.ac=29&attr.ad=30` +
			`&attr.ae=31&attr.af=32&attr.ag=33`,
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw) // keep what parsed, as Gin's c.Request.URL.Query() does
		sel, err := discovery.ParseQuerySelector(q)
		if err != nil {
			return
		}
		if verr := sel.Validate(); verr != nil {
			t.Fatalf("accepted an invalid selector %v: %v", sel, verr)
		}
		attrs := 0
		for name, vals := range q {
			key, ok := strings.CutPrefix(name, "attr.")
			if !ok {
				continue
			}
			attrs++
			if len(vals) != 1 || sel[key] != vals[0] {
				t.Fatalf("parameter %s=%q became %q", name, vals, sel[key])
			}
		}
		if attrs != len(sel) {
			t.Fatalf("%d attr parameters, %d pairs", attrs, len(sel))
		}
		if !sel.Matches(sel) {
			t.Fatalf("%v does not match itself", sel)
		}

		key := sel.Key()
		again, err := discovery.ParseQuerySelector(q)
		if err != nil || again.Key() != key {
			t.Fatalf("second parse: %v, key %q vs %q", err, again.Key(), key)
		}
		// Keys and values cannot hold ',' or '=', so the key reads back into the selector.
		back := discovery.Selector{}
		if key != "" {
			for pair := range strings.SplitSeq(key, ",") {
				k, v, ok := strings.Cut(pair, "=")
				if !ok {
					t.Fatalf("key %q: pair %q without '='", key, pair)
				}
				if _, dup := back[k]; dup {
					t.Fatalf("key %q: %q twice", key, k)
				}
				back[k] = v
			}
		}
		if back.Key() != key || len(back) != len(sel) || !back.Matches(sel) {
			t.Fatalf("key %q reads back as %v, not %v", key, back, sel)
		}
		// The selector, written as a query again, parses to the same key.
		enc := url.Values{}
		for k, v := range sel {
			enc.Set("attr."+k, v)
		}
		re, err := discovery.ParseQuerySelector(mustParseQuery(t, enc.Encode()))
		if err != nil || re.Key() != key {
			t.Fatalf("re-encoded %q: %v, key %q vs %q", enc.Encode(), err, re.Key(), key)
		}
	})
}

func mustParseQuery(t *testing.T, raw string) url.Values {
	t.Helper()
	q, err := url.ParseQuery(raw)
	if err != nil {
		t.Fatalf("parse %q: %v", raw, err)
	}
	return q
}
