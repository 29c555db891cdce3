package discovery

// lru is a map whose entries are also kept in order of last use, so that a table fed by
// crawlers (sessions, ended leases, cooldowns) can be capped by dropping what was used
// longest ago. It is not safe for concurrent use: the store's lock guards it.
type lru[K comparable, V any] struct {
	items map[K]*lruItem[K, V]
	// head is the most recently used item, tail the least.
	head, tail *lruItem[K, V]
}

type lruItem[K comparable, V any] struct {
	key        K
	val        V
	prev, next *lruItem[K, V]
}

func newLRU[K comparable, V any]() *lru[K, V] {
	return &lru[K, V]{items: map[K]*lruItem[K, V]{}}
}

func (c *lru[K, V]) len() int { return len(c.items) }

// get returns k's item without changing the order.
func (c *lru[K, V]) get(k K) (*lruItem[K, V], bool) {
	it, ok := c.items[k]
	return it, ok
}

// put sets k to v and makes it the most recent.
func (c *lru[K, V]) put(k K, v V) *lruItem[K, V] {
	if it, ok := c.items[k]; ok {
		it.val = v
		c.touch(it)
		return it
	}
	it := &lruItem[K, V]{key: k, val: v}
	c.items[k] = it
	c.pushFront(it)
	return it
}

// touch makes it the most recent.
func (c *lru[K, V]) touch(it *lruItem[K, V]) {
	if c.head == it {
		return
	}
	c.unlink(it)
	c.pushFront(it)
}

func (c *lru[K, V]) remove(it *lruItem[K, V]) {
	c.unlink(it)
	delete(c.items, it.key)
}

// oldest is the least recently used item, or nil.
func (c *lru[K, V]) oldest() *lruItem[K, V] { return c.tail }

func (c *lru[K, V]) pushFront(it *lruItem[K, V]) {
	it.prev, it.next = nil, c.head
	if c.head != nil {
		c.head.prev = it
	}
	c.head = it
	if c.tail == nil {
		c.tail = it
	}
}

func (c *lru[K, V]) unlink(it *lruItem[K, V]) {
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		c.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		c.tail = it.prev
	}
	it.prev, it.next = nil, nil
}
