package storetest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-dedup/dedup/stores"
)

// ownersTests are Run's tests of [stores.OwnerClaimer], run on a store
// whose Capabilities state Owners and skipped on one that keeps none.
var ownersTests = []struct {
	name string
	fn   func(e *env, oc stores.OwnerClaimer)
}{
	{"OwnerOfHolderAndTakenOver", testOwnerOfHolderAndTakenOver},
	{"OwnerMultiKey", testOwnerMultiKey},
	{"OwnerNotKeptByPlainClaim", testOwnerNotKeptByPlainClaim},
	{"OwnerLeavesDataAlone", testOwnerLeavesDataAlone},
	{"OwnerBound", testOwnerBound},
}

// owners returns the store as an OwnerClaimer, or skips the test.
func (e *env) owners() stores.OwnerClaimer {
	oc, ok := e.s.(stores.OwnerClaimer)
	if !ok || !e.s.Capabilities().Owners {
		e.t.Skip("the store keeps no owners (stores.OwnerClaimer)")
	}
	return oc
}

// owner is a binary owner blob of n bytes named by tag.
func owner(tag string, n int) []byte {
	b := bytes.Repeat([]byte{0, 0xff, '\n', 0x80}, n/4+1)[:n]
	copy(b, tag)
	return b
}

func (e *env) claimOwned(oc stores.OwnerClaimer, owner []byte, want stores.Result, keys ...string) *stores.Claim {
	e.t.Helper()
	c, err := oc.ClaimOwned(e.ctx, e.scope, keys, e.lease(), owner)
	if err != nil {
		e.t.Fatalf("ClaimOwned(%q, %q): %v", e.scope, keys, err)
	}
	if c == nil {
		e.t.Fatalf("ClaimOwned(%q, %q) returned a nil claim and no error", e.scope, keys)
	}
	e.mustResult(c, want)
	return c
}

func (e *env) mustOwner(c *stores.Claim, want []byte) {
	e.t.Helper()
	if !bytes.Equal(c.Owner, want) {
		e.t.Fatalf("%s claim of %q: Owner %q, want %q", c.Result, c.Keys, c.Owner, want)
	}
}

// An in-progress claim sees the holder's owner; a takeover sees the
// owner of the run whose lease expired; a fresh claim sees none.
func testOwnerOfHolderAndTakenOver(e *env, oc stores.OwnerClaimer) {
	k := e.key("a")
	a, b, c := owner("run-a", 25), owner("run-b", 25), owner("run-c", 25)
	first := e.claimOwned(oc, a, stores.Claimed, k)
	e.mustOwner(first, nil)
	if ad, ok := e.s.(stores.Admin); ok && e.s.Capabilities().Admin {
		rec, err := ad.Get(e.ctx, e.scope, k)
		if err != nil || !bytes.Equal(rec.Owner, a) {
			e.t.Fatalf("Admin.Get of an owned processing record: Owner %q, %v; want %q", rec.Owner, err, a)
		}
	}
	e.mustOwner(e.claimOwned(oc, b, stores.InProgress, k), a)
	e.advance(e.lease() + e.lease()/2)
	cur := e.claimOwned(oc, c, stores.Claimed, k)
	if !cur.Takeover {
		e.t.Fatal("claim of an expired lease does not report Takeover")
	}
	e.mustOwner(cur, a)
	mustBe(e.t, "stale Complete", e.s.Complete(e.ctx, first, e.retention(), nil), stores.ErrLostClaim)
	e.mustOwner(e.claimOwned(oc, b, stores.InProgress, k), c)
	e.mustOwner(e.expect([]string{k}, stores.InProgress), c)
	e.complete(cur, nil)
	if ad, ok := e.s.(stores.Admin); ok && e.s.Capabilities().Admin {
		rec, err := ad.Get(e.ctx, e.scope, k)
		if err != nil || rec.Owner != nil || len(rec.Data) != 0 {
			e.t.Fatalf("Admin.Get of a done record: Owner %q, Data %q, %v; want neither", rec.Owner, rec.Data, err)
		}
	}
	d := e.claimOwned(oc, b, stores.Duplicate, k)
	e.mustOwner(d, nil)
	if len(d.Data) != 0 {
		e.t.Fatalf("Duplicate Data = %q after a Complete without data, want none: the owner is not data", d.Data)
	}
}

// A multi-key claim keeps the owner on every key, and an Extend keeps
// it: a claim held by any of them sees it.
func testOwnerMultiKey(e *env, oc stores.OwnerClaimer) {
	k1, k2, k3 := e.key("m1"), e.key("m2"), e.key("m3")
	a := owner("multi-a", 25)
	held := e.claimOwned(oc, a, stores.Claimed, k1, k2)
	if err := e.s.Extend(e.ctx, held, e.lease()); err != nil {
		e.t.Fatalf("Extend(%q): %v", held.Keys, err)
	}
	e.mustOwner(e.claimOwned(oc, owner("b", 25), stores.InProgress, k3, k2), a)
	e.mustOwner(e.claimOwned(oc, nil, stores.InProgress, k1), a)
	e.release(held)
	again := e.claimOwned(oc, nil, stores.Claimed, k2, k1)
	if again.Takeover {
		e.t.Fatal("a claim after Release reports Takeover")
	}
	e.mustOwner(again, nil)
	e.mustOwner(e.claimOwned(oc, a, stores.InProgress, k1), nil)
	e.complete(again, []byte("done"))
}

// Claim, and ClaimOwned without an owner, keep none, and a record
// released and claimed again forgets its former owner.
func testOwnerNotKeptByPlainClaim(e *env, oc stores.OwnerClaimer) {
	k := e.key("plain")
	c := e.expect([]string{k}, stores.Claimed)
	e.mustOwner(e.claimOwned(oc, owner("x", 25), stores.InProgress, k), nil)
	e.release(c)
	c = e.claimOwned(oc, owner("y", 25), stores.Claimed, k)
	e.release(c)
	c = e.claimOwned(oc, []byte{}, stores.Claimed, k)
	e.mustOwner(c, nil)
	e.mustOwner(e.claimOwned(oc, owner("z", 25), stores.InProgress, k), nil)
	e.complete(c, nil)
}

// The owner is not a done record's data: Complete keeps its data only.
func testOwnerLeavesDataAlone(e *env, oc stores.OwnerClaimer) {
	for i, data := range [][]byte{nil, []byte("outputs"), owner("looks-like-an-owner", 25)} {
		k := e.key(fmt.Sprint("data-", i))
		c := e.claimOwned(oc, owner(fmt.Sprint("run-", i), stores.MaxOwner), stores.Claimed, k)
		e.complete(c, data)
		d := e.claimOwned(oc, owner("dup", 25), stores.Duplicate, k)
		if !bytes.Equal(d.Data, data) {
			e.t.Fatalf("case %d: Duplicate Data %q, want %q", i, d.Data, data)
		}
		e.mustOwner(d, nil)
	}
}

// An owner of MaxOwner bytes is kept whole; a longer one is refused
// before any I/O, and claims nothing.
func testOwnerBound(e *env, oc stores.OwnerClaimer) {
	k := e.key("bound")
	_, err := oc.ClaimOwned(e.ctx, e.scope, []string{k}, e.lease(), owner("long", stores.MaxOwner+1))
	mustBe(e.t, "ClaimOwned with an owner of MaxOwner+1 bytes", err, stores.ErrInvalidArgument)
	full := owner(strings.Repeat("f", 8), stores.MaxOwner)
	c := e.claimOwned(oc, full, stores.Claimed, k)
	e.mustOwner(e.claimOwned(oc, nil, stores.InProgress, k), full)
	e.complete(c, nil)
}

// runOwners runs ownersTests, each in a subtest of t.
func (s *suite) runOwners(t *testing.T) {
	for _, tc := range ownersTests {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t)
			tc.fn(e, e.owners())
		})
	}
}
