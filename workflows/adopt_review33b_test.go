package workflows

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities"
)

func review33bFresh() ProxyState {
	s := ProxyState{Unlisted: true}
	s.applySpec(SpecSignal{UID: "u1", Generation: 3, Spec: *managedSpec()})
	return s
}

// TestReview33bPublishedNumberOverflowsCounter
//
// Defect: adopt trusts the number in status.instanceName without bound. strconv.Atoi
// accepts up to math.MaxInt, so a status naming "px-<hash>-9223372036854775807" (a
// hand-edited or restored status; the subresource is writable by whoever holds
// proxies/status) sets Counter to MaxInt and the next allocation overflows: instance
// numbers go negative ("px-<hash>--9223372036854775808"), adopt's "newest by number"
// ranking then takes the newest instance for the oldest, and number() of later names
// no longer moves the counter past them (names can be reused). A number far beyond any
// instance count should be ignored or clamped.
func TestReview33bPublishedNumberOverflowsCounter(t *testing.T) {
	s := review33bFresh()
	s.adopt(activities.FindResult{Published: InstanceName("u1", math.MaxInt)}, t0)
	name := s.ensureInstance(t0)
	assert.Positive(t, s.Counter, "the counter wrapped around: %d", s.Counter)
	assert.False(t, strings.Contains(name, "--"), "a negative instance number: %s", name)
}
