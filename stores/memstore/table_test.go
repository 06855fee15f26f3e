package memstore

import (
	"math/rand/v2"
	"testing"
)

func (t *table) put(h hkey, r record) {
	p, _ := t.slot(h)
	*p = r
}

// The table behaves as a map through random inserts, overwrites, deletes
// and sweeps, across growths, with hashes crowded into few home slots so
// that probe chains are long and wrap around the end of the table.
func TestTableAgainstMap(t *testing.T) {
	for _, homes := range []uint64{1 << 40, 64, 7} {
		rng := rand.New(rand.NewPCG(1, homes))
		var tb table
		ref := map[hkey]record{}
		key := func() hkey { return hkey{a: rng.Uint64N(300) + 1, b: rng.Uint64N(homes)} }
		for op := range 100_000 {
			h := key()
			switch x := rng.IntN(100); {
			case x < 50:
				r := record{until: int64(op), token: rng.Uint64N(3)}
				tb.put(h, r)
				ref[h] = r
			case x < 80:
				tb.delete(h)
				delete(ref, h)
			case x < 99:
				if p := tb.ref(h); p != nil {
					p.until++
					r := ref[h]
					r.until++
					ref[h] = r
				}
			default:
				cut := int64(op) - 500
				n := tb.deleteIf(func(_ hkey, r record) bool { return r.until < cut })
				want := 0
				for k, r := range ref {
					if r.until < cut {
						delete(ref, k)
						want++
					}
				}
				if n != want {
					t.Fatalf("homes %d, op %d: deleteIf removed %d, want %d", homes, op, n, want)
				}
			}
			if tb.len() != len(ref) {
				t.Fatalf("homes %d, op %d: len %d, want %d", homes, op, tb.len(), len(ref))
			}
			if op%4000 == 0 {
				for k, want := range ref {
					if got, ok := tb.get(k); !ok || got != want {
						t.Fatalf("homes %d, op %d: get(%v) = %v, %v; want %v", homes, op, k, got, ok, want)
					}
				}
				seen := 0
				for _, s := range tb.slots {
					if s.h != (hkey{}) {
						seen++
						if _, ok := ref[s.h]; !ok {
							t.Fatalf("homes %d, op %d: table holds deleted %v", homes, op, s.h)
						}
					}
				}
				if seen != len(ref) {
					t.Fatalf("homes %d, op %d: %d slots taken, want %d", homes, op, seen, len(ref))
				}
			}
		}
	}
}
