package memstore

// A shard's records: the record key (hkey), the record, and the
// open-addressing table that keeps them.

// hkey identifies a (scope, key) pair: its 128-bit hash under the store's
// two random seeds. Records hold no key bytes and no pointers, so the maps
// cost the garbage collector nothing to scan and a record costs no
// allocation of its own.
type hkey struct{ a, b uint64 }

// record is one (scope, key): 16 bytes. For a processing record until is
// the lease end and token its owner's; for a done record until is its
// expiry and token is 0. Data kept with a done record lives in a side map,
// so the common record without data pays nothing for it.
type record struct {
	until int64 // unix nanoseconds
	token uint64
}

func (r record) done() bool { return r.token == 0 }

// table is a shard's records: an open-addressing hash table with linear
// probing and backward-shift deletion, indexed by the record's own 128-bit
// hash (no second hashing). A slot is 32 bytes, two to a cache line, and
// holds no pointer: a lookup usually costs one cache miss, an insert after
// it none, and the garbage collector never scans the table.
//
// The zero hkey marks an empty slot; Store.hash never returns it.
type table struct {
	slots []slot
	n     int
}

type slot struct {
	h hkey
	r record
}

const (
	minSlots = 16
	// A table grows when more than maxLoadNum/maxLoadDen of its slots
	// would be taken: linear probing stays short up to about 3/4.
	maxLoadNum, maxLoadDen = 3, 4
)

func (t *table) len() int { return t.n }

func (t *table) mask() uint64 { return uint64(len(t.slots) - 1) }

// find returns the index of h's slot and true, or the index of the empty
// slot where h would go and false. The table must have a free slot.
func (t *table) find(h hkey) (int, bool) {
	m := t.mask()
	for i := h.b & m; ; i = (i + 1) & m {
		s := &t.slots[i]
		if s.h == h {
			return int(i), true
		}
		if s.h == (hkey{}) {
			return int(i), false
		}
	}
}

// get returns h's record.
func (t *table) get(h hkey) (record, bool) {
	if t.n == 0 {
		return record{}, false
	}
	i, ok := t.find(h)
	if !ok {
		return record{}, false
	}
	return t.slots[i].r, true
}

// ref returns a pointer to h's record, valid until the next insert or
// delete, or nil.
func (t *table) ref(h hkey) *record {
	if t.n == 0 {
		return nil
	}
	i, ok := t.find(h)
	if !ok {
		return nil
	}
	return &t.slots[i].r
}

// slot returns h's slot, making room for it if absent (found reports
// which): the caller fills in a new slot's record. It is valid until the
// next insert or delete.
func (t *table) slot(h hkey) (s *record, found bool) {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
	}
	i, ok := t.find(h)
	if !ok {
		t.slots[i].h = h
		t.n++
	}
	return &t.slots[i].r, ok
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, max(2*len(old), minSlots))
	m := t.mask()
	for _, s := range old {
		if s.h == (hkey{}) {
			continue
		}
		i := s.h.b & m
		for t.slots[i].h != (hkey{}) {
			i = (i + 1) & m
		}
		t.slots[i] = s
	}
}

// delete removes h's record, if any.
func (t *table) delete(h hkey) {
	if t.n == 0 {
		return
	}
	if i, ok := t.find(h); ok {
		t.deleteAt(i)
	}
}

// deleteAt empties slot i and shifts back the records after it whose probe
// would otherwise cross the hole, so that no lookup stops early.
func (t *table) deleteAt(i int) {
	m := t.mask()
	hole := uint64(i)
	for j := (hole + 1) & m; t.slots[j].h != (hkey{}); j = (j + 1) & m {
		home := t.slots[j].h.b & m
		// Move j into the hole unless its home lies cyclically in
		// (hole, j]: then it is still reachable from its home.
		if (j-home)&m >= (j-hole)&m {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = slot{}
	t.n--
}

// deleteIf removes every record for which drop returns true, and returns
// how many it removed.
func (t *table) deleteIf(drop func(h hkey, r record) bool) int {
	removed := 0
	for i := 0; i < len(t.slots); {
		s := t.slots[i]
		if s.h != (hkey{}) && drop(s.h, s.r) {
			// A later record may shift into i: look at i again. Records
			// only move back, into holes at or after i (or, wrapping,
			// from the start of the table, already looked at: looking
			// again is harmless).
			t.deleteAt(i)
			removed++
			continue
		}
		i++
	}
	return removed
}
