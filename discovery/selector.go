package discovery

import (
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// Selector is a set of attribute equalities a proxy must all satisfy.
type Selector map[string]string

var (
	selectorKeyRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$`)
	selectorValueRE = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$`)
)

// maxSelectorPairs bounds a selector; a Proxy has at most 32 attributes.
const maxSelectorPairs = 32

// Validate checks keys and values against the rules the Proxy API enforces on attributes,
// so a selector that no proxy could ever match is refused instead of answered with 409.
func (s Selector) Validate() error {
	if len(s) > maxSelectorPairs {
		return fmt.Errorf("selector has %d attributes; at most %d", len(s), maxSelectorPairs)
	}
	for k, v := range s {
		if !selectorKeyRE.MatchString(k) {
			return fmt.Errorf("selector key %q: use 1-63 lowercase alphanumerics, '-', '_' or '.'", k)
		}
		if !selectorValueRE.MatchString(v) {
			return fmt.Errorf("selector value %q for %q: use at most 63 alphanumerics, '-', '_' or '.'", v, k)
		}
	}
	return nil
}

// Key is a canonical string for the selector (sorted k=v pairs).
func (s Selector) Key() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(s[k])
	}
	return b.String()
}

// Matches reports whether attrs has every pair of the selector.
func (s Selector) Matches(attrs map[string]string) bool {
	for k, v := range s {
		if got, ok := attrs[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ParseQuerySelector reads attr.<key>=<value> query parameters. Other parameters are left
// to the caller; a repeated attribute is an error (an equality cannot hold twice).
func ParseQuerySelector(q url.Values) (Selector, error) {
	sel := Selector{}
	for name, vals := range q {
		key, ok := strings.CutPrefix(name, "attr.")
		if !ok {
			continue
		}
		if len(vals) != 1 {
			return nil, fmt.Errorf("attribute %q given %d times", key, len(vals))
		}
		sel[key] = vals[0]
	}
	return sel, sel.Validate()
}
