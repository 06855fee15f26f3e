package redisstore

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// The key layout: the Redis key of each (scope, key), and back.

// keyLayout is what the key layout reads of a Config: Prefix,
// CompactKeys and DigestKeysLongerThan (see [Store.layout]).
type keyLayout struct {
	prefix     string
	compact    bool
	digestOver int // DigestKeysLongerThan
}

// Key layout:
//
//	Prefix ‖ esc(scope) ‖ kind ‖ body
//
// (or, with Config.CompactKeys, Prefix ‖ the first 12 bytes of
// SHA-256(esc(scope) ‖ kind ‖ body): see compactKey).
//
// esc percent-encodes the bytes '%', ':', '=', '#' and '{' of the scope, so
// the first kind byte after the prefix ends the scope and no scope can open
// a Redis Cluster hash tag. The kind byte says how the key is stored:
const (
	kindRaw    = ':' // body = the key, with '%' and '{' percent-encoded
	kindUUID   = '=' // body = esc(text before the UUID) ‖ the UUID's 16 bytes
	kindDigest = '#' // body = the first 16 bytes of SHA-256(key)
)

// digestLen is the size of a digested key body: 128 bits.
const digestLen = 16

// uuidLen is the length of a canonical UUID in text form.
const uuidLen = 36

// encodeKey returns the Redis key of (scope, key). It is injective over
// (scope, key) for raw and UUID-packed keys; digested keys are distinct
// unless SHA-256 collides on its first 128 bits, and compact keys unless it
// collides on its first 96.
func (l keyLayout) encodeKey(scope, key string) string {
	if l.compact {
		return l.compactKey(scope, key)
	}
	b := make([]byte, 0, len(l.prefix)+len(scope)+2+min(len(key), 64))
	b = append(b, l.prefix...)
	return bytesToString(l.appendLayout(b, scope, key))
}

// appendLayout appends esc(scope) ‖ kind ‖ body to b.
func (l keyLayout) appendLayout(b []byte, scope, key string) []byte {
	b = appendEscaped(b, scope, isScopeSpecial)
	switch {
	case l.digests(key) && !isUUID(key):
		// A bare UUID packs losslessly into the same 16 bytes, so only
		// other long keys pay the (tiny) collision risk of a digest.
		sum := sha256.Sum256([]byte(key))
		b = append(b, kindDigest)
		b = append(b, sum[:digestLen]...)
	case len(key) >= uuidLen && isUUID(key[len(key)-uuidLen:]):
		head := key[:len(key)-uuidLen]
		b = append(b, kindUUID)
		b = appendEscaped(b, head, isKeySpecial)
		b = appendUUID(b, key[len(head):])
	default:
		b = append(b, kindRaw)
		b = appendEscaped(b, key, isKeySpecial)
	}
	return b
}

// compactLen is the size of a compact key's digest: 96 bits.
const compactLen = 12

// compactKey returns Prefix ‖ the first 96 bits of SHA-256 of the
// readable layout of (scope, key), which is injective (Validate makes sure
// DigestKeysLongerThan is 0), so different pairs are digests of different
// inputs. Like a packed UUID, the binary
// bytes may hold a '{'; they hash to a uniformly random slot either way.
func (l keyLayout) compactKey(scope, key string) string {
	var buf [128]byte
	sum := sha256.Sum256(l.appendLayout(buf[:0], scope, key))
	b := make([]byte, 0, len(l.prefix)+compactLen)
	b = append(b, l.prefix...)
	b = append(b, sum[:compactLen]...)
	return bytesToString(b)
}

// digests reports whether key is stored as a digest under the config.
func (l keyLayout) digests(key string) bool {
	return l.digestOver > 0 && len(key) > l.digestOver
}

func isScopeSpecial(c byte) bool {
	return c == '%' || c == kindRaw || c == kindUUID || c == kindDigest || c == '{'
}

func isKeySpecial(c byte) bool { return c == '%' || c == '{' }

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends s with the bytes for which special is true written
// as %XX. Ordinary scopes and keys have none and are copied as they are.
func appendEscaped(b []byte, s string, special func(byte) bool) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if special(c) {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	return b
}

// isUUID reports whether s is a canonical lower-case UUID
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), the form watermill.NewUUID
// produces. Upper-case UUIDs are stored raw: packing them would lose case.
func isUUID(s string) bool {
	if len(s) != uuidLen {
		return false
	}
	for i := 0; i < uuidLen; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// appendUUID appends the 16 bytes of a UUID that isUUID accepted.
func appendUUID(b []byte, s string) []byte {
	var hi byte
	odd := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '-' {
			continue
		}
		n := c - '0'
		if c >= 'a' {
			n = c - 'a' + 10
		}
		if odd {
			b = append(b, hi<<4|n)
		} else {
			hi = n
		}
		odd = !odd
	}
	return b
}

// hasHashTag reports whether every key starting with prefix hashes to the
// same Redis Cluster slot: the prefix holds a complete, non-empty hash tag
// ("{dedup}:"). Redis hashes the text between the first '{' and the first
// '}' after it, when that text is not empty.
func hasHashTag(prefix string) bool {
	open := strings.IndexByte(prefix, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(prefix[open+1:], '}')
	return end > 0
}

// The inverse of the key layout, for the admin interface (admin.go).

// decodeKey returns the (scope, key) a Redis key of this store stands
// for, as far as the layout keeps them: nothing with CompactKeys, the
// scope alone for a digested key. A key under the prefix that this store
// would not have written (its re-encoding differs) decodes to nothing.
func (l keyLayout) decodeKey(rkey string) (scope, key string, scopeOK, keyOK bool) {
	rest, ok := strings.CutPrefix(rkey, l.prefix)
	if !ok || l.compact {
		return "", "", false, false
	}
	// esc(scope) holds no kind byte: the first one ends it.
	i := strings.IndexAny(rest, string([]byte{kindRaw, kindUUID, kindDigest}))
	if i < 0 {
		return "", "", false, false
	}
	scope, ok = unescape(rest[:i])
	if !ok {
		return "", "", false, false
	}
	body := rest[i+1:]
	switch rest[i] {
	case kindDigest:
		if len(body) != digestLen {
			return "", "", false, false
		}
		return scope, "", true, false
	case kindUUID:
		if len(body) < 16 {
			return "", "", false, false
		}
		head, ok := unescape(body[:len(body)-16])
		if !ok {
			return "", "", false, false
		}
		key = head + formatUUID(body[len(body)-16:])
	default:
		if key, ok = unescape(body); !ok {
			return "", "", false, false
		}
	}
	if l.encodeKey(scope, key) != rkey {
		return "", "", false, false
	}
	return scope, key, true, true
}

// unescape is the inverse of appendEscaped: %XX (upper-case hexadecimal)
// is the byte XX. ok is false for a malformed escape.
func unescape(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
		if hi < 0 || lo < 0 {
			return "", false
		}
		b = append(b, byte(hi<<4|lo))
		i += 2
	}
	return string(b), true
}

// formatUUID is the inverse of appendUUID.
func formatUUID(b string) string {
	const hex = "0123456789abcdef"
	out := make([]byte, 0, uuidLen)
	for i := 0; i < 16; i++ {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[b[i]>>4], hex[b[i]&15])
	}
	return string(out)
}

// printable writes a Redis key as redis-cli shows it between quotes:
// printable ASCII as it is, but for '\' and '"'; \n, \r, \t, \a, \b; any
// other byte as \xhh.
func printable(rkey string) string {
	var b strings.Builder
	for i := 0; i < len(rkey); i++ {
		switch c := rkey[i]; c {
		case '\\', '"':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		default:
			if c >= 0x20 && c < 0x7f {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		}
	}
	return b.String()
}

// unprintable is the inverse of printable: ok is false for a text that
// printable would not have written.
func unprintable(text string) (string, bool) {
	b := make([]byte, 0, len(text))
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		if i+1 == len(text) {
			return "", false
		}
		i++
		switch text[i] {
		case '\\', '"':
			b = append(b, text[i])
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'a':
			b = append(b, '\a')
		case 'b':
			b = append(b, '\b')
		case 'x':
			if i+2 >= len(text) {
				return "", false
			}
			hi, lo := strings.IndexByte("0123456789abcdef", text[i+1]), strings.IndexByte("0123456789abcdef", text[i+2])
			if hi < 0 || lo < 0 {
				return "", false
			}
			b = append(b, byte(hi<<4|lo))
			i += 2
		default:
			return "", false
		}
	}
	// One form only: printable's (no \x41 for A, no bare quote).
	if printable(string(b)) != text {
		return "", false
	}
	return string(b), true
}

// globEscape makes s match itself in a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// matchPattern is the SCAN MATCH pattern of the store's records, or of
// the records of one scope (readable layout only).
func (l keyLayout) matchPattern(scope string, byScope bool) string {
	if !byScope {
		return globEscape(l.prefix) + "*"
	}
	esc := appendEscaped(nil, scope, isScopeSpecial)
	return globEscape(l.prefix+string(esc)) + "[" + string([]byte{kindRaw, kindUUID, kindDigest}) + "]*"
}
