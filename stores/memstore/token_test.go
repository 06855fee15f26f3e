package memstore

import (
	"math"
	"strconv"
	"testing"
)

// parseToken and claimBuf.token agree with strconv, which they replace
// on the claim path.
func TestTokenFormat(t *testing.T) {
	for _, v := range []uint64{1, 9, 10, 15, 16, 255, 256, 0xdeadbeef, 1 << 63, math.MaxUint64 - 1, math.MaxUint64} {
		var cb claimBuf
		if got, want := cb.token(v), strconv.FormatUint(v, 16); got != want {
			t.Errorf("token(%d) = %q, want %q", v, got, want)
		}
	}
	for _, s := range []string{"", "0", "1", "a", "F", "ff", "Ff", "00000000000000001", "ffffffffffffffff", "10000000000000000",
		"fffffffffffffffff", "g", "-1", "+1", "1_0", "0x1", " 1", "deadBEEF", "\xff"} {
		want, err := strconv.ParseUint(s, 16, 64)
		got, ok := parseToken(s)
		if ok != (err == nil) || (ok && got != want) {
			t.Errorf("parseToken(%q) = %d, %v; strconv: %d, %v", s, got, ok, want, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add("deadbeef")
	f.Fuzz(func(t *testing.T, s string) {
		want, err := strconv.ParseUint(s, 16, 64)
		got, ok := parseToken(s)
		if ok != (err == nil) || (ok && got != want) {
			t.Errorf("parseToken(%q) = %d, %v; strconv: %d, %v", s, got, ok, want, err)
		}
	})
}
