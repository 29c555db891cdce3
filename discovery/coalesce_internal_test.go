package discovery

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestCoalescerKeepsWorkingWhenFull: a coalescer that once held more live cooldowns than
// its cap still sweeps expired ones and coalesces again afterwards.
func TestCoalescerKeepsWorkingWhenFull(t *testing.T) {
	var c coalescer
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range maxCoalesced + 20_000 {
		c.admit(fmt.Sprint("k", i), t0, t0.Add(time.Minute))
	}
	assert.LessOrEqual(t, len(c.until), maxCoalesced, "bounded")
	later := t0.Add(time.Hour) // every cooldown above has ended
	assert.True(t, c.admit("new", later, later.Add(time.Minute)))
	assert.False(t, c.admit("new", later, later.Add(time.Minute)), "the second report within the cooldown is coalesced")
	assert.Less(t, len(c.until), 1000, "the expired entries were swept")
}
