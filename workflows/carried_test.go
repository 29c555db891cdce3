package workflows

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a ProxyWorkflow run carries across continue-as-new (ProxyWorkflowInput, with its
// state) is read by the next run, which may be a newer or an older build of the worker
// during a rollout or a rollback. It is a versioned schema: fields are added, never
// changed in type or removed. Two checks hold it to that:
//
//   - testdata/carried/schema.txt lists every field path and its type. A field may be
//     added (the test says which lines to append); a listed one may not change or go.
//   - testdata/carried/ keeps the inputs runs of every version carried, extracted from
//     the recorded histories (which are recorded again for each new version and would
//     otherwise lose them) and written by hand for shapes that were carried but never
//     recorded. Every one must decode strictly into today's types.

var updateCarried = flag.Bool("update-carried", false, "add the ProxyWorkflow inputs of the recorded histories to testdata/carried, and new fields to schema.txt")

func TestCarriedSchemaOnlyGrows(t *testing.T) {
	got := carriedSchema(reflect.TypeFor[ProxyWorkflowInput]())
	path := filepath.Join("testdata", "carried", "schema.txt")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var want []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			want = append(want, line)
		}
	}
	fields := map[string]string{}
	for _, line := range got {
		p, typ, _ := strings.Cut(line, " ")
		fields[p] = typ
	}
	for _, line := range want {
		p, typ, _ := strings.Cut(line, " ")
		have, ok := fields[p]
		if assert.True(t, ok, "%s was carried by earlier runs and is gone: a field is never removed (runs of older builds still send it and read it)", p) {
			assert.Equal(t, typ, have, "%s changed type: add a new field instead, and decode both where one was carried (see InstanceRef.UnmarshalJSON)", p)
		}
	}
	var added []string
	for _, line := range got {
		if !slices.Contains(want, line) {
			p, _, _ := strings.Cut(line, " ")
			if !slices.ContainsFunc(want, func(w string) bool { return strings.HasPrefix(w, p+" ") }) {
				added = append(added, line)
			}
		}
	}
	if len(added) > 0 && *updateCarried {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteString(strings.Join(added, "\n") + "\n")
		require.NoError(t, errors.Join(err, f.Close()))
		return
	}
	assert.Empty(t, added, "new carried fields: append them to %s (go test ./workflows -run TestCarriedSchemaOnlyGrows -update-carried)", path)
}

// carriedSchema lists "path type" for every JSON field reachable from t. Types that encode
// themselves (time.Time, resource.Quantity, …) are leaves named by their Go type.
func carriedSchema(t reflect.Type) []string {
	var out []string
	var walk func(path string, t reflect.Type, seen []reflect.Type)
	marshaler := reflect.TypeFor[json.Marshaler]()
	walk = func(path string, t reflect.Type, seen []reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler):
			out = append(out, path+" "+t.String())
			return
		case slices.Contains(seen, t) && t.Kind() == reflect.Struct:
			out = append(out, path+" "+t.String()+" (recursive)")
			return
		}
		switch t.Kind() {
		case reflect.Struct:
			seen = append(seen, t)
			for i := range t.NumField() {
				f := t.Field(i)
				if !f.IsExported() {
					continue
				}
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" {
					continue
				}
				if f.Anonymous && name == "" {
					walk(path, f.Type, seen)
					continue
				}
				if name == "" {
					name = f.Name
				}
				walk(strings.TrimPrefix(path+"."+name, "."), f.Type, seen)
			}
		case reflect.Slice, reflect.Array:
			if t.Elem().Kind() == reflect.Uint8 {
				out = append(out, path+" bytes")
				return
			}
			walk(path+"[]", t.Elem(), seen)
		case reflect.Map:
			walk(path+"{"+t.Key().String()+"}", t.Elem(), seen)
		default:
			// The kind, not the Go name: a named string type (Phase, Duration) is a JSON
			// string either way, and may be renamed freely.
			out = append(out, path+" "+t.Kind().String())
		}
	}
	walk("", t, nil)
	slices.Sort(out)
	return out
}

func TestCarriedInputsDecode(t *testing.T) {
	recorded := recordedInputs(t)
	require.NotEmpty(t, recorded, "the histories carry ProxyWorkflow inputs")
	dir := filepath.Join("testdata", "carried")
	if *updateCarried {
		for name, data := range recorded {
			p := filepath.Join(dir, name)
			if _, err := os.Stat(p); err == nil {
				continue // kept as first recorded
			}
			var pretty bytes.Buffer
			require.NoError(t, json.Indent(&pretty, data, "", "  "))
			require.NoError(t, os.WriteFile(p, append(pretty.Bytes(), '\n'), 0o644))
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	require.NoError(t, err)
	inputs := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		inputs[filepath.Base(f)] = b
	}
	for name, b := range recorded {
		inputs["history:"+name] = b
	}
	for v := int(versionLongLived); v <= LatestVersion; v++ { // runs of version 0 never continue as new
		assert.True(t, slices.ContainsFunc(slices.Collect(maps.Keys(inputs)), func(n string) bool { return strings.HasPrefix(n, fmt.Sprintf("v%d-", v)) }),
			"testdata/carried has an input of version %d", v)
	}
	for name, b := range inputs {
		t.Run(name, func(t *testing.T) {
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			var in ProxyWorkflowInput
			require.NoError(t, dec.Decode(&in), "a carried input must decode into today's types")
			require.NotEmpty(t, in.Name)
		})
	}
}

// TestLostDecodesAsEveryVersionCarriedIt: "lost" was a bool, then for a day a string (the
// reason), and is a bool again beside "lostReason".
func TestLostDecodesAsEveryVersionCarriedIt(t *testing.T) {
	for _, tc := range []struct {
		json       string
		lost       bool
		lostReason string
	}{
		{`{"name":"a","lost":true}`, true, ""},
		{`{"name":"a","lost":false}`, false, ""},
		{`{"name":"a"}`, false, ""},
		{`{"name":"a","lost":"preempted"}`, true, "preempted"},
		{`{"name":"a","lost":""}`, false, ""},
		{`{"name":"a","lost":true,"lostReason":"gone"}`, true, "gone"},
	} {
		var r InstanceRef
		require.NoError(t, json.Unmarshal([]byte(tc.json), &r), tc.json)
		assert.Equal(t, tc.lost, r.Lost, tc.json)
		assert.Equal(t, tc.lostReason, r.LostReason, tc.json)
		assert.Equal(t, "a", r.Name)
	}
	out, err := json.Marshal(InstanceRef{Name: "a", Lost: true, LostReason: LostPreempted})
	require.NoError(t, err)
	assert.Contains(t, string(out), `"lost":true`, "older builds read a bool under lost")
	var old struct {
		Lost bool `json:"lost"`
	}
	require.NoError(t, json.Unmarshal(out, &old), "what a build from before the string decodes")
	assert.True(t, old.Lost)
}

// recordedInputs are the inputs of the ProxyWorkflow runs in the recorded histories that
// started with state (a run after continue-as-new), and the inputs their continue-as-new
// events carried, named v<version>-<history>-<n>.json.
func recordedInputs(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "histories", "v*", "*.json"))
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var h struct {
			Events []struct {
				Started *struct {
					WorkflowType struct{ Name string } `json:"workflowType"`
					Input        payloads              `json:"input"`
				} `json:"workflowExecutionStartedEventAttributes"`
				Continued *struct {
					WorkflowType struct{ Name string } `json:"workflowType"`
					Input        payloads              `json:"input"`
				} `json:"workflowExecutionContinuedAsNewEventAttributes"`
			} `json:"events"`
		}
		require.NoError(t, json.Unmarshal(b, &h), f)
		version := filepath.Base(filepath.Dir(f))
		base := strings.TrimSuffix(filepath.Base(f), ".json")
		n := 0
		for _, e := range h.Events {
			var in payloads
			switch {
			case e.Started != nil && e.Started.WorkflowType.Name == "ProxyWorkflow":
				in = e.Started.Input
			case e.Continued != nil && e.Continued.WorkflowType.Name == "ProxyWorkflow":
				in = e.Continued.Input
			default:
				continue
			}
			if len(in.Payloads) == 0 {
				continue
			}
			data, err := base64.StdEncoding.DecodeString(in.Payloads[0].Data)
			require.NoError(t, err)
			if !bytes.Contains(data, []byte(`"state"`)) {
				continue // a first start: nothing carried
			}
			n++
			out[fmt.Sprintf("%s-%s-%d.json", version, base, n)] = data
		}
	}
	return out
}

type payloads struct {
	Payloads []struct {
		Data string `json:"data"`
	} `json:"payloads"`
}
