package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDecideScale(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	base := scaleInput{now: at(600), min: 0, max: 12, perProxy: 4, target: 80, delay: 5 * time.Minute}
	with := func(f func(*scaleInput)) scaleInput {
		in := base
		f(&in)
		return in
	}
	tests := []struct {
		name           string
		in             scaleInput
		desired        int
		wanted         int
		limit          string
		stabilized     bool
		historyLen     int
		historyHighest int
	}{
		{name: "idle at zero stays at zero", in: with(func(in *scaleInput) {}), desired: 0, historyLen: 1},
		{name: "the first waiting request starts one proxy",
			in: with(func(in *scaleInput) { in.demand = 1 }), desired: 1, wanted: 1, historyLen: 1, historyHighest: 1},
		{name: "demand fills 80% of 4 leases a proxy: 14 leases want 5",
			in: with(func(in *scaleInput) { in.current, in.demand = 2, 14 }), desired: 5, wanted: 5, historyLen: 1, historyHighest: 5},
		{name: "exactly the target fills the proxies it has",
			in: with(func(in *scaleInput) { in.current, in.demand, in.target = 4, 16, 100 }), desired: 4, wanted: 4},
		{name: "demand past the maximum stops at it",
			in: with(func(in *scaleInput) { in.current, in.demand = 3, 400 }), desired: 12, wanted: 125, limit: "max"},
		{name: "the minimum holds with no demand",
			in: with(func(in *scaleInput) {
				in.current, in.min = 3, 2
				in.history = []recommendation{{at(100), 3}}
			}), desired: 2, wanted: 0, limit: "min", historyLen: 1, historyHighest: 2},
		{name: "after a restart a lower demand waits a whole delay",
			in: with(func(in *scaleInput) { in.current, in.demand = 6, 3 }), desired: 6, wanted: 1, stabilized: true,
			historyLen: 2, historyHighest: 6},
		{name: "a lull shorter than the delay shrinks nothing",
			in: with(func(in *scaleInput) {
				in.current, in.demand = 6, 0
				in.history = []recommendation{{at(400), 6}, {at(590), 2}}
			}), desired: 6, wanted: 0, stabilized: true, historyLen: 3, historyHighest: 6},
		{name: "once the delay has passed it shrinks to the highest of the window",
			in: with(func(in *scaleInput) {
				in.current, in.demand = 6, 0
				in.history = []recommendation{{at(200), 6}, {at(400), 3}, {at(590), 2}}
			}), desired: 3, wanted: 0, stabilized: true, historyLen: 3, historyHighest: 3},
		{name: "growth is at once, whatever the window holds",
			in: with(func(in *scaleInput) {
				in.current, in.demand = 3, 30
				in.history = []recommendation{{at(400), 3}}
			}), desired: 10, wanted: 10, historyLen: 1, historyHighest: 10},
		{name: "a kubectl scale past the maximum comes back to it at once",
			in: with(func(in *scaleInput) {
				in.current, in.demand = 50, 40
				in.history = []recommendation{{at(590), 12}}
			}), desired: 12, wanted: 13, limit: "max", historyLen: 1, historyHighest: 12},
		{name: "an old high recommendation never scales up",
			in: with(func(in *scaleInput) {
				in.current, in.demand = 2, 4
				in.history = []recommendation{{at(590), 9}}
			}), desired: 2, wanted: 2, historyLen: 2, historyHighest: 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decideScale(tc.in)
			assert.Equal(t, tc.desired, d.desired, "desired")
			assert.Equal(t, tc.wanted, d.wanted, "wanted")
			assert.Equal(t, tc.limit, d.limit, "limit")
			assert.Equal(t, tc.stabilized, d.stabilized, "stabilized")
			if tc.historyLen > 0 {
				assert.Len(t, d.history, tc.historyLen)
				assert.Equal(t, tc.historyHighest, d.history[0].replicas, "the window's highest comes first")
			}
		})
	}
}

// TestDecideScaleHistoryStaysSmall: a day-long delay looked at every five seconds keeps
// no more history than the distinct sizes recommended in it.
func TestDecideScaleHistoryStaysSmall(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	in := scaleInput{now: now, current: 12, max: 12, perProxy: 4, target: 80, delay: 24 * time.Hour}
	for i := range 17280 {
		in.now = now.Add(time.Duration(i) * 5 * time.Second)
		in.demand = (i * 7) % 40
		d := decideScale(in)
		in.history, in.current = d.history, d.desired
	}
	assert.LessOrEqual(t, len(in.history), 13)
}
