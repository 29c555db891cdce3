package codes

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docRows reads the rows "| status | `code`[, `code`] | ..." of docs/api.md's table that
// starts after heading, as code → status.
func docRows(t *testing.T, doc, after string) map[string]int {
	t.Helper()
	i := strings.Index(doc, after)
	require.GreaterOrEqual(t, i, 0, "docs/api.md has %q", after)
	rows := map[string]int{}
	row := regexp.MustCompile(`^\| (\d{3}) \| ([^|]+) \|`)
	started := false
	for _, line := range strings.Split(doc[i:], "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			if started && !strings.HasPrefix(line, "|") {
				break // the end of the first table after the heading
			}
			continue
		}
		started = true
		status, _ := strconv.Atoi(m[1])
		for _, c := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[2], -1) {
			rows[c[1]] = status
		}
	}
	return rows
}

// TestDocsSayWhatTheTableSays: docs/api.md's table of the lease API's errors gives every
// API code with the status the API answers it with, and its table of the gateway's own
// answers gives the gateway's statuses, so the reference cannot drift from the server.
func TestDocsSayWhatTheTableSays(t *testing.T) {
	raw, err := os.ReadFile("../../docs/api.md")
	require.NoError(t, err)
	doc := string(raw)

	api := docRows(t, doc, "\n## Errors\n")
	assert.ElementsMatch(t, API(), keys(api), "the lease API's codes")
	for c, st := range api {
		assert.Equal(t, Status(c), st, "status of %s", c)
	}

	gateway := docRows(t, doc, "What the gateway answers itself is")
	require.NotEmpty(t, gateway)
	for c, st := range gateway {
		assert.Equal(t, Of(c).GatewayStatus, st, "gateway status of %s", c)
	}
	for _, c := range []string{ProxyAuthRequired, UpstreamFailed, NoMatch} {
		assert.Contains(t, gateway, c)
	}
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
