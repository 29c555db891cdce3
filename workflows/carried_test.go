package workflows

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
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
// themselves (time.Time, resource.Quantity, netip.Addr, …) are leaves named by their Go
// type. A field encoded as a string by its tag's ",string" option says so: the option
// changes the field's JSON type in place.
func carriedSchema(t reflect.Type) []string {
	var out []string
	var walk func(path string, t reflect.Type, seen []reflect.Type, quoted bool)
	marshaler := reflect.TypeFor[json.Marshaler]()
	textMarshaler := reflect.TypeFor[encoding.TextMarshaler]()
	walk = func(path string, t reflect.Type, seen []reflect.Type, quoted bool) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler):
			out = append(out, path+" "+t.String())
			return
		case t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(textMarshaler):
			// encoding/json writes these as strings (map keys are named by type anyway).
			out = append(out, path+" "+t.String()+" (text)")
			return
		case slices.Contains(seen, t) && t.Kind() == reflect.Struct:
			out = append(out, path+" "+t.String()+" (recursive)")
			return
		}
		switch t.Kind() {
		case reflect.Struct:
			seen = append(seen, t)
			n := len(out)
			defer func() {
				if len(out) == n && path != "" {
					// An empty struct ("local": {}) is a field all the same: its line
					// catches it being renamed or removed.
					out = append(out, path+" struct (empty)")
				}
			}()
			for i := range t.NumField() {
				f := t.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" && opts == "" {
					continue
				}
				if f.Anonymous && name == "" {
					// encoding/json promotes the exported fields of an embedded struct,
					// exported or not.
					if ft := f.Type; f.IsExported() || ft.Kind() == reflect.Struct {
						walk(path, ft, seen, false)
					}
					continue
				}
				if !f.IsExported() {
					continue
				}
				if name == "" {
					name = f.Name
				}
				q := slices.Contains(strings.Split(opts, ","), "string")
				walk(strings.TrimPrefix(path+"."+name, "."), f.Type, seen, q)
			}
		case reflect.Slice:
			if t.Elem().Kind() == reflect.Uint8 && !t.Elem().Implements(marshaler) && !t.Elem().Implements(textMarshaler) {
				out = append(out, path+" bytes")
				return
			}
			walk(path+"[]", t.Elem(), seen, false)
		case reflect.Array: // an array of bytes is a JSON array of numbers, not base64
			walk(path+"[]", t.Elem(), seen, false)
		case reflect.Map:
			walk(path+"{"+t.Key().String()+"}", t.Elem(), seen, false)
		default:
			// The kind, not the Go name: a named string type (Phase, Duration) is a JSON
			// string either way, and may be renamed freely.
			line := path + " " + t.Kind().String()
			switch t.Kind() {
			case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
				reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
				reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
				if quoted {
					line += " (as string)"
				}
			}
			out = append(out, line)
		}
	}
	walk("", t, nil, false)
	slices.Sort(out)
	return out
}

// TestCarriedSchemaSeesTypeChangesInPlace: every way a field can change its JSON type
// without changing its name changes its schema line.
func TestCarriedSchemaSeesTypeChangesInPlace(t *testing.T) {
	type inner struct {
		A int `json:"a"`
	}
	type Exported struct {
		P string `json:"p"`
	}
	type promoted struct {
		Q string `json:"q"`
	}
	for _, tc := range []struct {
		name          string
		before, after reflect.Type
	}{
		{"int to string", reflect.TypeFor[struct {
			X int `json:"x"`
		}](), reflect.TypeFor[struct {
			X string `json:"x"`
		}]()},
		{"the ,string option", reflect.TypeFor[struct {
			X int64 `json:"x"`
		}](), reflect.TypeFor[struct {
			X int64 `json:"x,string"`
		}]()},
		{"a struct replaced by a string", reflect.TypeFor[struct {
			X inner `json:"x"`
		}](), reflect.TypeFor[struct {
			X string `json:"x"`
		}]()},
		{"map key type", reflect.TypeFor[struct {
			X map[string]int `json:"x"`
		}](), reflect.TypeFor[struct {
			X map[int]int `json:"x"`
		}]()},
		{"json tag renamed", reflect.TypeFor[struct {
			X int `json:"x"`
		}](), reflect.TypeFor[struct {
			X int `json:"y"`
		}]()},
		{"a text marshaler's type", reflect.TypeFor[struct {
			X netip.Addr `json:"x"`
		}](), reflect.TypeFor[struct {
			X netip.Prefix `json:"x"`
		}]()},
		{"a string replaced by a text marshaler", reflect.TypeFor[struct {
			X string `json:"x"`
		}](), reflect.TypeFor[struct {
			X netip.Addr `json:"x"`
		}]()},
		{"an empty struct renamed", reflect.TypeFor[struct {
			X struct{} `json:"x"`
		}](), reflect.TypeFor[struct {
			X struct{} `json:"y"`
		}]()},
		{"bytes to an array of bytes", reflect.TypeFor[struct {
			X []byte `json:"x"`
		}](), reflect.TypeFor[struct {
			X [32]byte `json:"x"`
		}]()},
		{"a promoted field of an unexported embedded struct", reflect.TypeFor[struct {
			promoted
		}](), reflect.TypeFor[struct {
			Exported
		}]()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotEqual(t, carriedSchema(tc.before), carriedSchema(tc.after))
		})
	}
	// What does not change the JSON type does not change the line.
	assert.Equal(t, carriedSchema(reflect.TypeFor[struct {
		X *int `json:"x"`
	}]()), carriedSchema(reflect.TypeFor[struct {
		X int `json:"x,omitempty"`
	}]()))
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
	schema := carriedSchema(reflect.TypeFor[ProxyWorkflowInput]())
	for name, b := range inputs {
		t.Run(name, func(t *testing.T) {
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			var in ProxyWorkflowInput
			require.NoError(t, dec.Decode(&in), "a carried input must decode into today's types")
			require.NotEmpty(t, in.Name)
			// DisallowUnknownFields stops at a type that decodes itself (InstanceRef, and
			// the spec inside it): every key is checked against the schema as well.
			assert.Empty(t, unknownPaths(t, b, schema), "fields today's types do not know")
		})
	}
}

// unknownPaths lists the keys of the JSON document b whose paths are not in schema (as
// carriedSchema writes it), however the types decode themselves.
func unknownPaths(t *testing.T, b []byte, schema []string) []string {
	t.Helper()
	var doc any
	require.NoError(t, json.Unmarshal(b, &doc))
	leaves := map[string]bool{}
	var paths []string
	for _, line := range schema {
		p, _, _ := strings.Cut(line, " ")
		leaves[p] = true
		paths = append(paths, p)
	}
	known := func(p string) bool {
		return slices.ContainsFunc(paths, func(s string) bool {
			return s == p || strings.HasPrefix(s, p+".") || strings.HasPrefix(s, p+"[") || strings.HasPrefix(s, p+"{")
		})
	}
	var unknown []string
	var walk func(p string, v any)
	walk = func(p string, v any) {
		if leaves[p] {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			for _, s := range paths {
				if rest, ok := strings.CutPrefix(s, p+"{"); ok && (p != "" || strings.HasPrefix(s, "{")) {
					key, _, _ := strings.Cut(rest, "}")
					for _, e := range v {
						walk(p+"{"+key+"}", e)
					}
					return
				}
			}
			for k, e := range v {
				c := strings.TrimPrefix(p+"."+k, ".")
				if !known(c) {
					unknown = append(unknown, c)
					continue
				}
				walk(c, e)
			}
		case []any:
			for _, e := range v {
				walk(p+"[]", e)
			}
		}
	}
	walk("", doc)
	slices.Sort(unknown)
	return slices.Compact(unknown)
}

// TestCarriedStrictDecodeReachesEveryInstance: a field no type knows, anywhere in an
// input, is found, inside an instance record and its spec too.
func TestCarriedStrictDecodeReachesEveryInstance(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "carried", "v3-lost-as-its-reason.json"))
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	state := doc["state"].(map[string]any)
	retiring := state["retiring"].([]any)[0].(map[string]any)
	retiring["renamedHash"] = "2a88a68613384761"
	retiring["spec"].(map[string]any)["bogus"] = true
	state["next"].(map[string]any)["bogus"] = 1
	b, err = json.Marshal(doc)
	require.NoError(t, err)
	schema := carriedSchema(reflect.TypeFor[ProxyWorkflowInput]())
	assert.Equal(t, []string{"state.next.bogus", "state.retiring[].renamedHash", "state.retiring[].spec.bogus"}, unknownPaths(t, b, schema))
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
