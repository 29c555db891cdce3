package discovery

import "time"

// cooldownKey names one cooldown: a proxy resting for a target ("" = every target).
type cooldownKey struct{ proxyID, target string }

// cooldowns are the rests that reports start, kept until the proxy's workflow has made
// them durable (they then come back in Proxy.Cooldowns) and after, for as long as they
// last. Crawlers choose the targets, so the table is capped: in total (least recently
// reported out) and per proxy (the one ending first out). Dropping one only means a proxy banned on that site may be
// offered for it again, and reported again; the durable copy in the workflow, if the
// report reached it, still applies.
type cooldowns struct {
	all      *lru[cooldownKey, time.Time]
	byProxy  map[string]map[string]*lruItem[cooldownKey, time.Time]
	max      int
	perProxy int
}

func newCooldowns(max, perProxy int) *cooldowns {
	return &cooldowns{all: newLRU[cooldownKey, time.Time](), byProxy: map[string]map[string]*lruItem[cooldownKey, time.Time]{},
		max: max, perProxy: perProxy}
}

func (c *cooldowns) len() int { return c.all.len() }

// until is when proxyID stops resting for target; zero if it does not.
func (c *cooldowns) until(proxyID, target string) time.Time {
	if it, ok := c.byProxy[proxyID][target]; ok {
		return it.val
	}
	return time.Time{}
}

// set rests proxyID for target until the given time, or longer if it already does.
func (c *cooldowns) set(proxyID, target string, until time.Time) {
	k := cooldownKey{proxyID, target}
	if it, ok := c.all.get(k); ok {
		if until.After(it.val) {
			it.val = until
		}
		c.all.touch(it)
		return
	}
	targets := c.byProxy[proxyID]
	if targets == nil {
		targets = map[string]*lruItem[cooldownKey, time.Time]{}
		c.byProxy[proxyID] = targets
	}
	if len(targets) >= c.perProxy {
		// The proxy's cooldown that ends first goes: it is the least worth keeping. A scan
		// of at most perProxy items, only for a proxy already at its cap.
		var first *lruItem[cooldownKey, time.Time]
		for _, it := range targets {
			if first == nil || it.val.Before(first.val) {
				first = it
			}
		}
		c.drop(first)
	}
	if c.all.len() >= c.max {
		c.drop(c.all.oldest())
	}
	targets[target] = c.all.put(k, until)
}

func (c *cooldowns) drop(it *lruItem[cooldownKey, time.Time]) {
	if it == nil {
		return
	}
	c.all.remove(it)
	targets := c.byProxy[it.key.proxyID]
	delete(targets, it.key.target)
	if len(targets) == 0 {
		delete(c.byProxy, it.key.proxyID)
	}
}

// sweep forgets cooldowns that ended before now, from the least recently reported, and
// stops at the first one still running: sweeping never scans the whole table under the
// store's lock. Ended cooldowns behind a running one wait for a later sweep or for the
// cap; until() callers compare with the time anyway.
func (c *cooldowns) sweep(now time.Time) {
	for it := c.all.oldest(); it != nil && !it.val.After(now); it = c.all.oldest() {
		c.drop(it)
	}
}
