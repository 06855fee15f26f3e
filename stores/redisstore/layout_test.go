package redisstore

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
)

// FuzzEncodeKey checks that decodeKey inverts encodeKey for raw and
// UUID-packed keys. That it can is the proof that the layout is
// injective: two (scope, key) pairs with the same Redis key would decode
// to the same pair.
func FuzzEncodeKey(f *testing.F) {
	for _, seed := range [][2]string{
		{"orders", "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"},
		{"orders", "msg:0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"},
		{"orders", "0B9E5C3A-7F0D-4C1E-9A55-1D2F3E4A5B6C"},
		{"a:b", "c"}, {"a", "b:c"}, {"a{", "}b"}, {"a{b}", "c"},
		{"%3A", ":"}, {"=", "#"}, {"", "\x00\xff"}, {"s", "%7B"},
		{"h", "x0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6"},
	} {
		f.Add(seed[0], seed[1])
	}
	s := &Store{cfg: Config{Prefix: DefaultPrefix}}
	f.Fuzz(func(t *testing.T, scope, key string) {
		rk := s.encodeKey(scope, key)
		// Only the 16 binary bytes of a packed UUID may hold a '{' (they
		// hash like any random bytes); escaped text never does.
		text := rk[len(DefaultPrefix):]
		if i := strings.IndexAny(text, ":=#"); i >= 0 && text[i] == kindUUID {
			text = text[:len(text)-16]
		}
		if strings.ContainsRune(text, '{') {
			t.Fatalf("encodeKey(%q, %q) = %q opens a hash tag", scope, key, rk)
		}
		gs, gk, sok, kok := s.decodeKey(rk)
		if !sok || !kok || gs != scope || gk != key {
			t.Fatalf("encodeKey(%q, %q) = %q decodes to (%q, %q, %v, %v)", scope, key, rk, gs, gk, sok, kok)
		}
	})
}

func TestEncodeKeyDigest(t *testing.T) {
	s := &Store{cfg: Config{Prefix: "p:", DigestKeysLongerThan: 16}}
	const id = "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"
	if rk := s.encodeKey("s", id); rk[3] != kindUUID {
		t.Errorf("a bare UUID is digested (%q), not packed", rk)
	}
	for _, k := range []string{"msg:" + id, strings.Repeat("k", 17), strings.Repeat("k", 1<<20)} {
		rk := s.encodeKey("s", k)
		if rk[3] != kindDigest || len(rk) != 4+digestLen {
			t.Errorf("key of %d bytes encodes to %q, want a digest", len(k), rk)
		}
	}
	if rk := s.encodeKey("s", strings.Repeat("k", 16)); rk != "p:s:"+strings.Repeat("k", 16) {
		t.Errorf("a 16-byte key encodes to %q, want it verbatim", rk)
	}
}

func TestHasHashTag(t *testing.T) {
	for prefix, want := range map[string]bool{
		"dedup:": false, "{dedup}:": true, "x{y}": true, "{}": false,
		"{": false, "}{a}": true, "a{b": false, "{}{a}": false,
	} {
		if got := hasHashTag(prefix); got != want {
			t.Errorf("hasHashTag(%q) = %v, want %v", prefix, got, want)
		}
	}
}

func TestDecodeValue(t *testing.T) {
	tok := strings.Repeat("A", tokenLen)
	for v, want := range map[string]record{
		"1":                         {},
		"dxyz":                      {data: []byte("xyz")},
		"p" + tok + "30000":         {processing: true, token: tok},
		processingValue(tok, 5, ""): {processing: true, token: tok},
		processingValue(tok, 5, ownerSuffix([]byte("o:1"))): {processing: true, token: tok},
		"D12345678":    {by: "12345678"},
		"D12345678xyz": {by: "12345678", data: []byte("xyz")},
	} {
		got, err := decodeValue(v)
		if err != nil || got.processing != want.processing || got.token != want.token || string(got.data) != string(want.data) || got.by != want.by {
			t.Errorf("decodeValue(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "2", "x", "p" + tok, "hello", "D1234567"} {
		if _, err := decodeValue(v); err == nil {
			t.Errorf("decodeValue(%q) accepted a foreign value", v)
		}
	}
}

func TestParseReplies(t *testing.T) {
	good := []any{
		[]any{int64(1)},
		[]any{int64(1), int64(2), "pTOKEN", int64(100)},
		[]any{int64(2), int64(1), "1"},
		[]any{int64(3)},
	}
	for _, v := range good {
		if _, err := parseClaim(v); err != nil {
			t.Errorf("parseClaim(%v): %v", v, err)
		}
	}
	bad := []any{nil, "x", []any{}, []any{"1"}, []any{int64(4)}, []any{int64(1), int64(2)}, []any{int64(2), int64(1)}}
	for _, v := range bad {
		if _, err := parseClaim(v); err == nil {
			t.Errorf("parseClaim(%v) accepted a malformed reply", v)
		}
	}
	if n, err := parseFenced(int64(0)); n != -1 || err != nil {
		t.Errorf("parseFenced(0) = %d, %v", n, err)
	}
	if n, err := parseFenced(int64(2)); n != 1 || err != nil {
		t.Errorf("parseFenced(2) = %d, %v", n, err)
	}
	if _, err := parseFenced("x"); err == nil {
		t.Error("parseFenced accepted a string")
	}
}

func TestDecodeKeyLayouts(t *testing.T) {
	const id = "0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c"
	digest := &Store{cfg: Config{Prefix: "p:", DigestKeysLongerThan: 16}}
	for _, tc := range []struct {
		s          *Store
		scope, key string
		keyOK      bool
	}{
		{digest, "orders", "short", true},
		{digest, "orders", id, true},
		{digest, "or:ders", "msg:" + id, false}, // digested: the scope only
		{digest, "a{b}", strings.Repeat("k", 40), false},
		{&Store{cfg: Config{Prefix: "{x}:"}}, "%3A", "msg:" + id, true},
	} {
		rk := tc.s.encodeKey(tc.scope, tc.key)
		scope, key, sok, kok := tc.s.decodeKey(rk)
		if !sok || scope != tc.scope || kok != tc.keyOK || (kok && key != tc.key) {
			t.Errorf("decodeKey(encodeKey(%q, %q)) = %q, %q, %v, %v", tc.scope, tc.key, scope, key, sok, kok)
		}
	}
	compact := &Store{cfg: Config{Prefix: "d:", CompactKeys: true}}
	if _, _, sok, kok := compact.decodeKey(compact.encodeKey("s", "k")); sok || kok {
		t.Error("a compact key decodes to a scope or key")
	}
	plain := &Store{cfg: Config{Prefix: "p:"}}
	for _, rk := range []string{"q:s:k", "p:", "p:sk", "p:s%zz:k", "p:s:%4", "p:s=short", "p:s#" + strings.Repeat("x", 15), "p:s:%7b"} {
		if _, _, sok, kok := plain.decodeKey(rk); sok || kok {
			t.Errorf("decodeKey(%q) decodes a key the store does not write", rk)
		}
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"dedup:loyalty:msg:1":     "dedup:loyalty:msg:1",
		"a\"b\\c":                 `a\"b\\c`,
		"\x00\xff\n\r\t\a\b\x7f ": `\x00\xff\n\r\t\a\b\x7f `,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
		if back, ok := unprintable(want); !ok || back != in {
			t.Errorf("unprintable(%q) = %q, %v; want %q", want, back, ok, in)
		}
	}
	// Texts printable never writes.
	for _, text := range []string{`\`, `a\`, `\q`, `\x4`, `\x4G`, `\x41`, `\xFF`, `"`, "\x00\x01", "é"} {
		if back, ok := unprintable(text); ok {
			t.Errorf("unprintable(%q) = %q, want it refused", text, back)
		}
	}
}

// FuzzPrintable checks that unprintable inverts printable.
func FuzzPrintable(f *testing.F) {
	f.Add("dedup:s=\x00\xff{")
	f.Fuzz(func(t *testing.T, key string) {
		if back, ok := unprintable(printable(key)); !ok || back != key {
			t.Fatalf("unprintable(printable(%q)) = %q, %v", key, back, ok)
		}
	})
}

func TestMatchPattern(t *testing.T) {
	s := &Store{cfg: Config{Prefix: "a*[b]?\\:"}}
	if got, want := s.matchPattern("", false), `a\*\[b\]\?\\:*`; got != want {
		t.Errorf("matchPattern(all) = %q, want %q", got, want)
	}
	if got, want := s.matchPattern("s:*{", true), `a\*\[b\]\?\\:s%3A\*%7B[:=#]*`; got != want {
		t.Errorf("matchPattern(scope) = %q, want %q", got, want)
	}
}

func TestListCursor(t *testing.T) {
	for _, c := range []listCursor{
		{addr: "127.0.0.1:6379"},
		{addr: "h:1", scan: 1 << 63},
		{addr: "h:1", pending: []string{"dedup:s=\x00\xff{", ""}},
		{addr: "h:1", scan: 7, pending: []string{"dedup:s:a"}},
	} {
		got, err := parseCursor(c.String())
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("parseCursor(%v.String()) = %v, %v", c, got, err)
		}
	}
	v1 := base64.RawURLEncoding.EncodeToString([]byte("\x01\x03h:1\x00"))
	for _, s := range []string{"", "x", "AA", listCursor{}.String(), "AQ", v1} {
		if _, err := parseCursor(s); err == nil {
			t.Errorf("parseCursor(%q) accepted a malformed cursor", s)
		}
	}
}

// A processing value keeps its owner after the lease, behind ownerTag;
// the lease reads the same with or without it, and a value without one
// is byte for byte what it was before owners.
func TestProcessingValueOwner(t *testing.T) {
	tok := strings.Repeat("A", tokenLen)
	if v := processingValue(tok, 30000, ownerSuffix(nil)); v != "p"+tok+"30000" {
		t.Fatalf("a value without an owner = %q", v)
	}
	for _, owner := range [][]byte{nil, []byte("1"), []byte(":"), {0, 0xff, ':', '9'}} {
		v := processingValue(tok, 30000, ownerSuffix(owner))
		if got := ownerOf(v); string(got) != string(owner) || (owner == nil) != (got == nil) {
			t.Errorf("ownerOf(%q) = %q, want %q", v, got, owner)
		}
		if l, err := leaseMS(v); err != nil || l != 30000 {
			t.Errorf("leaseMS(%q) = %d, %v; want 30000", v, l, err)
		}
	}
	if got := ownerOf("dxyz:abc"); got != nil {
		t.Errorf("ownerOf of a done value = %q, want none", got)
	}
}
