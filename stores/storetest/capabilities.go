package storetest

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// The conformance tests of [stores.Capabilities]: every bound a store
// states is exact (the bound itself is accepted, one more is refused
// before any I/O, with the class the contract names, and changes
// nothing), and the booleans say what the store implements.

// cheapData is the most data the suite writes to check that exactly
// MaxData bytes are kept: a store stating more (a SQL column of 1 GiB,
// a Redis string of 512 MiB) is only checked to refuse MaxData+1 bytes,
// which costs no I/O, since writing and reading back its bound would
// cost seconds and gigabytes of memory on every run.
const cheapData = 2 << 20

// capabilitiesTests are Run's tests of Capabilities.
var capabilitiesTests = []struct {
	name string
	fn   func(e *env, c stores.Capabilities)
}{
	{"CapabilitiesInterfaces", testCapabilitiesInterfaces},
	{"CapabilitiesMaxLease", testCapabilitiesMaxLease},
	{"CapabilitiesMaxRetention", testCapabilitiesMaxRetention},
	{"CapabilitiesMaxScope", testCapabilitiesMaxScope},
	{"CapabilitiesMaxKey", testCapabilitiesMaxKey},
	{"CapabilitiesMaxData", testCapabilitiesMaxData},
	{"CapabilitiesAfterClose", testCapabilitiesAfterClose},
}

// skipUnbounded skips a test of a bound the store does not state.
func (e *env) skipUnbounded(what string, bound int64) {
	e.t.Helper()
	if bound <= 0 {
		e.t.Skipf("%s states no %s", e.s.Capabilities().Kind, what)
	}
}

func testCapabilitiesInterfaces(e *env, c stores.Capabilities) {
	if c.Kind == "" {
		e.t.Error("Capabilities.Kind is empty")
	}
	for _, b := range []struct {
		name, iface string
		said, does  bool
	}{
		{"Admin", "Admin", c.Admin, is[stores.Admin](e.s)},
		{"Inbox", "Inbox", c.Inbox, is[stores.Inbox](e.s)},
		{"JoinedTx", "TxJoiner", c.JoinedTx, is[stores.TxJoiner](e.s)},
		{"Owners", "OwnerClaimer", c.Owners, is[stores.OwnerClaimer](e.s)},
	} {
		if b.said != b.does {
			e.t.Errorf("Capabilities.%s = %t, but %T implements stores.%s: %t", b.name, b.said, e.s, b.iface, b.does)
		}
	}
	if c.JoinedTx && !c.Inbox {
		e.t.Error("Capabilities.JoinedTx without Inbox")
	}
	for _, b := range []struct {
		name  string
		bound int64
	}{
		{"MaxLease", int64(c.MaxLease)}, {"MaxRetention", int64(c.MaxRetention)},
		{"MaxScope", int64(c.MaxScope)}, {"MaxKey", int64(c.MaxKey)}, {"MaxData", int64(c.MaxData)},
	} {
		if b.bound < 0 {
			e.t.Errorf("Capabilities.%s = %d: a bound is positive, or 0 for none", b.name, b.bound)
		}
	}
	if again := e.s.Capabilities(); again != c {
		e.t.Errorf("Capabilities changed between two calls: %+v, then %+v", c, again)
	}
}

func is[T any](s stores.Store) bool {
	_, ok := s.(T)
	return ok
}

// held claims keys for a long lease (an hour, or MaxLease when shorter),
// so that a check of InProgress after a refused call does not depend on
// how fast the suite runs on a store that keeps time in real time.
func (e *env) held(c stores.Capabilities, keys ...string) *stores.Claim {
	e.t.Helper()
	lease := time.Hour
	if c.MaxLease > 0 {
		lease = min(lease, c.MaxLease)
	}
	cl := e.claimLease(lease, keys...)
	e.mustResult(cl, stores.Claimed)
	return cl
}

// overBound returns bound+1ns, or skips when bound cannot be exceeded.
func (e *env) overBound(bound time.Duration) time.Duration {
	e.t.Helper()
	if bound == math.MaxInt64 {
		e.t.Skip("the bound is the longest duration there is")
	}
	return bound + 1
}

func testCapabilitiesMaxLease(e *env, c stores.Capabilities) {
	e.skipUnbounded("MaxLease", int64(c.MaxLease))
	over := e.overBound(c.MaxLease)

	// One more nanosecond is refused, and claims nothing.
	k := e.key("over")
	_, err := e.s.Claim(e.ctx, e.scope, []string{k}, over)
	mustBe(e.t, "Claim with MaxLease+1ns", err, stores.ErrInvalidArgument)
	fresh := e.expect([]string{k}, stores.Claimed)
	if fresh.Takeover {
		e.t.Fatal("the refused claim left a record behind: the next claim took it over")
	}
	e.release(fresh)

	// The bound itself is accepted by Claim and Extend.
	c1 := e.claimLease(c.MaxLease, e.key("max"))
	e.mustResult(c1, stores.Claimed)
	if err := e.s.Extend(e.ctx, c1, c.MaxLease); err != nil {
		e.t.Fatalf("Extend with MaxLease (%s): %v", c.MaxLease, err)
	}
	mustBe(e.t, "Extend with MaxLease+1ns", e.s.Extend(e.ctx, c1, over), stores.ErrInvalidArgument)
	// The refused Extend changed nothing: the claim is still held, and
	// its owner's.
	e.expect([]string{e.key("max")}, stores.InProgress)
	e.complete(c1, nil)
	e.expect([]string{e.key("max")}, stores.Duplicate)
}

func testCapabilitiesMaxRetention(e *env, c stores.Capabilities) {
	e.skipUnbounded("MaxRetention", int64(c.MaxRetention))
	over := e.overBound(c.MaxRetention)

	k := e.key("a")
	cl := e.held(c, k)
	mustBe(e.t, "Complete with MaxRetention+1ns", e.s.Complete(e.ctx, cl, over, []byte("x")), stores.ErrInvalidArgument)
	// The claim is still processing, and completes with a valid retention.
	e.expect([]string{k}, stores.InProgress)
	if err := e.s.Complete(e.ctx, cl, c.MaxRetention, []byte("kept")); err != nil {
		e.t.Fatalf("Complete with MaxRetention (%s): %v", c.MaxRetention, err)
	}
	if d := e.expect([]string{k}, stores.Duplicate); string(d.Data) != "kept" {
		e.t.Fatalf("Data = %q, want %q", d.Data, "kept")
	}

	in, ok := e.s.(stores.Inbox)
	if !ok {
		return
	}
	ik := e.key("inbox")
	if _, err := in.Begin(e.ctx, e.scope, []string{ik}, over); !errors.Is(err, stores.ErrInvalidArgument) {
		e.t.Fatalf("Inbox.Begin with MaxRetention+1ns: got error %v, want one wrapping %v", err, stores.ErrInvalidArgument)
	}
	tx, err := in.Begin(e.ctx, e.scope, []string{ik}, c.MaxRetention)
	if err != nil {
		e.t.Fatalf("Inbox.Begin with MaxRetention (%s): %v", c.MaxRetention, err)
	}
	if tx.Result() != stores.Claimed {
		_ = tx.Rollback(e.ctx)
		e.t.Fatalf("Inbox.Begin with MaxRetention = %s, want claimed (the refused Begin left a record?)", tx.Result())
	}
	if err := tx.Commit(e.ctx, nil); err != nil {
		e.t.Fatalf("Commit: %v", err)
	}
	e.expect([]string{ik}, stores.Duplicate)
}

// fill returns prefix padded with 'x' to n bytes (prefix must be shorter).
func fill(prefix string, n int) string {
	if len(prefix) > n {
		prefix = prefix[len(prefix)-n:]
	}
	return prefix + strings.Repeat("x", n-len(prefix))
}

func testCapabilitiesMaxScope(e *env, c stores.Capabilities) {
	e.skipUnbounded("MaxScope", int64(c.MaxScope))
	k := e.key("a")
	longest := fill(e.scope+"-", c.MaxScope)
	_, err := e.s.Claim(e.ctx, longest+"y", []string{k}, e.lease())
	mustBe(e.t, "Claim in a scope of MaxScope+1 bytes", err, stores.ErrInvalidArgument)
	cl, err := e.s.Claim(e.ctx, longest, []string{k}, e.lease())
	if err != nil {
		e.t.Fatalf("Claim in a scope of MaxScope (%d) bytes: %v", c.MaxScope, err)
	}
	e.mustResult(cl, stores.Claimed)
	e.complete(cl, []byte("s"))
	d, err := e.s.Claim(e.ctx, longest, []string{k}, e.lease())
	if err != nil {
		e.t.Fatal(err)
	}
	e.mustResult(d, stores.Duplicate)
	// The refused scope was not taken for its first MaxScope bytes.
	other, err := e.s.Claim(e.ctx, longest[:len(longest)-1]+"z", []string{k}, e.lease())
	if err != nil {
		e.t.Fatal(err)
	}
	e.mustResult(other, stores.Claimed)
	e.release(other)
}

func testCapabilitiesMaxKey(e *env, c stores.Capabilities) {
	e.skipUnbounded("MaxKey", int64(c.MaxKey))
	longest := fill(e.key(""), c.MaxKey)
	_, err := e.s.Claim(e.ctx, e.scope, []string{longest + "y"}, e.lease())
	mustBe(e.t, "Claim of a key of MaxKey+1 bytes", err, stores.ErrInvalidKey)
	// With a valid key beside it, nothing is claimed either.
	_, err = e.s.Claim(e.ctx, e.scope, []string{e.key("ok"), longest + "y"}, e.lease())
	mustBe(e.t, "Claim of a valid key and a key of MaxKey+1 bytes", err, stores.ErrInvalidKey)
	e.release(e.expect([]string{e.key("ok")}, stores.Claimed))

	cl := e.expect([]string{longest}, stores.Claimed)
	e.complete(cl, []byte("k"))
	if d := e.expect([]string{longest}, stores.Duplicate); string(d.Data) != "k" {
		e.t.Fatalf("Data = %q, want %q", d.Data, "k")
	}
	// A key differing in its last byte is another record.
	e.release(e.expect([]string{longest[:len(longest)-1] + "z"}, stores.Claimed))
}

func testCapabilitiesMaxData(e *env, c stores.Capabilities) {
	e.skipUnbounded("MaxData", int64(c.MaxData))
	// Only the length counts: the bytes of the refused data are never
	// written (nor read), so a large bound costs address space only. It
	// is made before the claim, whose lease runs in real time on some
	// stores.
	tooLarge := make([]byte, c.MaxData+1)
	k := e.key("a")
	cl := e.held(c, k)
	err := e.s.Complete(e.ctx, cl, e.retention(), tooLarge)
	mustBe(e.t, "Complete with MaxData+1 bytes of data", err, stores.ErrTooLarge)
	mustBe(e.t, "Complete with MaxData+1 bytes of data", err, stores.ErrInvalidArgument)
	tooLarge = nil
	// The claim is still processing, the owner's to complete without the
	// data, as the middleware does.
	e.expect([]string{k}, stores.InProgress)
	e.complete(cl, nil)
	if d := e.expect([]string{k}, stores.Duplicate); len(d.Data) != 0 {
		e.t.Fatalf("Data = %d bytes, want none", len(d.Data))
	}

	if c.MaxData <= cheapData {
		// Exactly MaxData bytes are kept, and read back whole.
		data := make([]byte, c.MaxData)
		for i := range data {
			data[i] = byte(i*31 + i>>8)
		}
		km := e.key("max")
		e.complete(e.expect([]string{km}, stores.Claimed), data)
		if d := e.expect([]string{km}, stores.Duplicate); !bytes.Equal(d.Data, data) {
			e.t.Fatalf("Data of MaxData (%d) bytes: got %d bytes back, want them all, equal", c.MaxData, len(d.Data))
		}
	} else {
		e.t.Logf("MaxData is %d bytes, more than the suite writes (%d): only MaxData+1 is checked", c.MaxData, cheapData)
	}

	in, ok := e.s.(stores.Inbox)
	if !ok {
		return
	}
	tooLarge = make([]byte, c.MaxData+1)
	ik := e.key("inbox")
	tx, err := in.Begin(e.ctx, e.scope, []string{ik}, e.retention())
	if err != nil {
		e.t.Fatalf("Inbox.Begin: %v", err)
	}
	if tx.Result() != stores.Claimed {
		_ = tx.Rollback(e.ctx)
		e.t.Fatalf("Inbox.Begin = %s, want claimed", tx.Result())
	}
	err = tx.Commit(e.ctx, tooLarge)
	if !errors.Is(err, stores.ErrTooLarge) {
		_ = tx.Rollback(e.ctx)
		e.t.Fatalf("InboxTx.Commit with MaxData+1 bytes of data: got error %v, want one wrapping %v", err, stores.ErrTooLarge)
	}
	// The transaction is still open, and commits without the data.
	if err := tx.Commit(e.ctx, nil); err != nil {
		e.t.Fatalf("InboxTx.Commit without data after a refused one: %v", err)
	}
	e.expect([]string{ik}, stores.Duplicate)
}

func testCapabilitiesAfterClose(e *env, c stores.Capabilities) {
	if err := e.s.Close(e.ctx); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	if after := e.s.Capabilities(); after != c {
		e.t.Fatalf("Capabilities after Close = %+v, want %+v as before", after, c)
	}
}
