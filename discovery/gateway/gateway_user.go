package gateway

import (
	"fmt"
	"strings"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// gatewayUser is what a crawler asks of the gateway in its proxy username: the options
// ride there because a proxy URL has nowhere else to put them, and every crawler tool
// can set a proxy URL.
type gatewayUser struct {
	// client is the name the username starts with.
	client   string
	session  string
	selector discovery.Selector
}

// sessionOption is the one option that is not an attribute: every other key selects
// proxies whose attribute of that name has the value.
const sessionOption = "session"

// parseGatewayUser reads a gateway username in either of its forms:
//
//	shop-crawler;session=abc;region=eu   options after ';', each key=value
//	shop-crawler-session-abc-region-eu   options after '-', keys and values alternating
//
// The second form is for tools that mangle ';' or '=' in a proxy URL; in it no key or
// value can contain '-', and the client name is known (the token says which client this
// is), so a client name with dashes is not mistaken for options. known is that name, or
// "" when authentication is off: then the client part of the dash form is its first
// dash-separated part.
func parseGatewayUser(user, known string) (gatewayUser, error) {
	var u gatewayUser
	var pairs [][2]string
	if name, opts, ok := strings.Cut(user, ";"); ok {
		u.client = name
		for part := range strings.SplitSeq(opts, ";") {
			k, v, ok := strings.Cut(part, "=")
			if !ok || k == "" {
				return u, fmt.Errorf("username option %q: write key=value, options separated by ';'", part)
			}
			pairs = append(pairs, [2]string{k, v})
		}
	} else {
		rest := ""
		switch {
		case known != "" && user == known:
			u.client = user
		case known != "" && strings.HasPrefix(user, known+"-"):
			u.client, rest = known, user[len(known)+1:]
		case known != "":
			u.client = user // refused below as another client's name
		default:
			u.client, rest, _ = strings.Cut(user, "-")
		}
		if rest != "" {
			parts := strings.Split(rest, "-")
			if len(parts)%2 != 0 {
				return u, fmt.Errorf("username options %q: in the dash form keys and values alternate (key-value-key-value) and contain no '-'; use ';key=value' for values with dashes", rest)
			}
			for i := 0; i < len(parts); i += 2 {
				pairs = append(pairs, [2]string{parts[i], parts[i+1]})
			}
		}
	}
	if known != "" && u.client != known {
		return u, fmt.Errorf("the username must start with the client's name %q (then its options), not %q", known, u.client)
	}
	for _, p := range pairs {
		k, v := p[0], p[1]
		if k == sessionOption {
			if u.session != "" {
				return u, fmt.Errorf("username option %q is given twice", k)
			}
			if !discovery.ValidSession(v) {
				return u, fmt.Errorf("username option session=%q: use 1-128 letters, digits, '.', '_', '~', ':' or '-'", v)
			}
			u.session = v
			continue
		}
		if u.selector == nil {
			u.selector = discovery.Selector{}
		}
		if _, dup := u.selector[k]; dup {
			return u, fmt.Errorf("username option %q is given twice", k)
		}
		u.selector[k] = v
	}
	if err := u.selector.Validate(); err != nil {
		return u, fmt.Errorf("username options: %w", err)
	}
	return u, nil
}
