package radix

// smallKids is the fan-out kept in a slice before switching to a map.
const smallKids = 8

// kids holds a node's children keyed by their first block hash: a small
// slice for low fan-out, a map beyond smallKids.
type kids struct {
	small []*node
	big   map[uint64]*node
}

func (k *kids) get(h uint64) *node {
	if k.big != nil {
		return k.big[h]
	}
	for _, c := range k.small {
		if c.keys[0] == h {
			return c
		}
	}
	return nil
}

func (k *kids) put(c *node) {
	if k.big != nil {
		k.big[c.keys[0]] = c
		return
	}
	if len(k.small) < smallKids {
		k.small = append(k.small, c)
		return
	}
	k.big = make(map[uint64]*node, 2*smallKids)
	for _, o := range k.small {
		k.big[o.keys[0]] = o
	}
	k.big[c.keys[0]] = c
	k.small = nil
}

func (k *kids) del(h uint64) {
	if k.big != nil {
		delete(k.big, h)
		return
	}
	for i, c := range k.small {
		if c.keys[0] == h {
			last := len(k.small) - 1
			k.small[i] = k.small[last]
			k.small[last] = nil
			k.small = k.small[:last]
			return
		}
	}
}

func (k *kids) len() int {
	if k.big != nil {
		return len(k.big)
	}
	return len(k.small)
}

// only returns the single child (len() == 1).
func (k *kids) only() *node {
	if k.big != nil {
		for _, c := range k.big {
			return c
		}
		return nil
	}
	return k.small[0]
}

func (k *kids) each(f func(*node)) {
	if k.big != nil {
		for _, c := range k.big {
			f(c)
		}
		return
	}
	for _, c := range k.small {
		f(c)
	}
}

// list appends the children to dst (so callers may mutate k while walking).
func (k *kids) list(dst []*node) []*node {
	if k.big != nil {
		for _, c := range k.big {
			dst = append(dst, c)
		}
		return dst
	}
	return append(dst, k.small...)
}

func (k *kids) bytes() int64 {
	if k.big != nil {
		return int64(len(k.big)) * 20
	}
	return int64(cap(k.small)) * 8
}
