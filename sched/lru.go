package sched

// An intrusive doubly linked LRU list over a slab of entries addressed by
// uint32 index; index 0 is the nil sentinel. The session-affinity table and
// the prefix index both keep their shards' entries in one. Callers hold the
// shard lock.

// links are an entry's list pointers (and the free-list pointer, next).
type links struct{ prev, next uint32 }

func (l *links) lru() *links { return l }

// lruEntry is an entry type embedding links.
type lruEntry[E any] interface {
	*E
	lru() *links
}

// lruList is a list's ends: head is the most recently used.
type lruList struct{ head, tail uint32 }

func lruUnlink[E any, P lruEntry[E]](l *lruList, ents []E, i uint32) {
	e := P(&ents[i]).lru()
	if e.prev != 0 {
		P(&ents[e.prev]).lru().next = e.next
	} else {
		l.head = e.next
	}
	if e.next != 0 {
		P(&ents[e.next]).lru().prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = 0, 0
}

func lruPushFront[E any, P lruEntry[E]](l *lruList, ents []E, i uint32) {
	e := P(&ents[i]).lru()
	e.prev, e.next = 0, l.head
	if l.head != 0 {
		P(&ents[l.head]).lru().prev = i
	}
	l.head = i
	if l.tail == 0 {
		l.tail = i
	}
}

func lruMoveFront[E any, P lruEntry[E]](l *lruList, ents []E, i uint32) {
	if l.head == i {
		return
	}
	lruUnlink[E, P](l, ents, i)
	lruPushFront[E, P](l, ents, i)
}
