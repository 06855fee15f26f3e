package redisstore

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// decodeKey inverts encodeKey for raw and UUID-packed keys. That it exists
// is the proof that the layout is injective: two (scope, key) pairs with
// the same Redis key would decode to the same pair.
func decodeKey(prefix, rk string) (scope, key string, err error) {
	rest, ok := strings.CutPrefix(rk, prefix)
	if !ok {
		return "", "", fmt.Errorf("no prefix")
	}
	i := strings.IndexAny(rest, ":=#")
	if i < 0 {
		return "", "", fmt.Errorf("no kind byte")
	}
	if scope, err = unescape(rest[:i]); err != nil {
		return "", "", err
	}
	body := rest[i+1:]
	switch rest[i] {
	case kindRaw:
		key, err = unescape(body)
	case kindUUID:
		if len(body) < 16 {
			return "", "", fmt.Errorf("short UUID body")
		}
		head, err := unescape(body[:len(body)-16])
		if err != nil {
			return "", "", err
		}
		h := hex.EncodeToString([]byte(body[len(body)-16:]))
		key = head + h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	default:
		return "", "", fmt.Errorf("digest keys do not decode")
	}
	return scope, key, err
}

func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated escape")
		}
		v, err := hex.DecodeString(s[i+1 : i+3])
		if err != nil {
			return "", err
		}
		b.WriteByte(v[0])
		i += 2
	}
	return b.String(), nil
}

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
		gs, gk, err := decodeKey(DefaultPrefix, rk)
		if err != nil || gs != scope || gk != key {
			t.Fatalf("encodeKey(%q, %q) = %q decodes to (%q, %q, %v)", scope, key, rk, gs, gk, err)
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
		"1":                     {},
		"dxyz":                  {data: []byte("xyz")},
		"p" + tok + "30000":     {processing: true, token: tok},
		processingValue(tok, 5): {processing: true, token: tok},
	} {
		got, err := decodeValue(v)
		if err != nil || got.processing != want.processing || got.token != want.token || string(got.data) != string(want.data) {
			t.Errorf("decodeValue(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "2", "x", "p" + tok, "hello"} {
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
