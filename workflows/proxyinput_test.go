package workflows

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// TestStartInputIsTheWorkflowInput: the controller starts runs with proxyinput.Start and the
// workflow decodes ProxyWorkflowInput. The two are one JSON schema: every field of Start is
// the workflow's under the same name, the workflow's only other field is the state it
// carries across continue-as-new, and a start decodes to exactly what it said.
func TestStartInputIsTheWorkflowInput(t *testing.T) {
	fields := func(v any) map[string]reflect.Type {
		out := map[string]reflect.Type{}
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			f := rt.Field(i)
			out[f.Tag.Get("json")] = f.Type
		}
		return out
	}
	start, input := fields(proxyinput.Start{}), fields(ProxyWorkflowInput{})
	for tag, typ := range start {
		assert.Equal(t, typ, input[tag], "field %q", tag)
	}
	var extra []string
	for tag := range input {
		if _, ok := start[tag]; !ok {
			extra = append(extra, tag)
		}
	}
	assert.Equal(t, []string{"state,omitempty"}, slices.Sorted(slices.Values(extra)))

	sent := proxyinput.Start{Namespace: "crawl", Name: "eu-1", Installation: "prod",
		Tuning: proxyinput.Tuning{QuotaRetry: time.Minute, MaxRunSignals: 10}}
	raw, err := json.Marshal(sent)
	require.NoError(t, err)
	var got ProxyWorkflowInput
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, ProxyWorkflowInput{Namespace: "crawl", Name: "eu-1", Installation: "prod", Tuning: sent.Tuning}, got)
}
