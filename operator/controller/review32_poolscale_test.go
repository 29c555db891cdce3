package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestReview32HugeDemandHitsTheMaximum: the demand is a sum of integers read from
// discovery's JSON (every replica's part added, unchecked). A demand large enough that
// demand × 100 overflows wraps to zero or a negative number, and the pool is sized for no
// demand at all (down to minReplicas once the delay passes) instead of held at
// maxReplicas. status.demand is already clamped (min(d.Demand, 1<<30)); the decision is not.
func TestReview32HugeDemandHitsTheMaximum(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	d := decideScale(scaleInput{now: t0, current: 3, min: 0, max: 12, perProxy: 4, target: 80,
		delay: 5 * time.Minute, demand: 1 << 62})
	assert.Equal(t, "max", d.limit)
	assert.Equal(t, 12, d.desired, "wanted %d", d.wanted)
}
