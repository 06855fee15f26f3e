package redisstore

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// This file is the single place that knows how records are laid out in
// Redis: key encoding, value encoding, the Lua scripts and the arguments
// they take. Store methods build an [op] here and send it; the batcher
// (batching.go) puts many ops into one pipeline without knowing any of
// this.

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
func (s *Store) encodeKey(scope, key string) string {
	if s.cfg.CompactKeys {
		return s.compactKey(scope, key)
	}
	b := make([]byte, 0, len(s.cfg.Prefix)+len(scope)+2+min(len(key), 64))
	b = append(b, s.cfg.Prefix...)
	return bytesToString(s.appendLayout(b, scope, key))
}

// appendLayout appends esc(scope) ‖ kind ‖ body to b.
func (s *Store) appendLayout(b []byte, scope, key string) []byte {
	b = appendEscaped(b, scope, isScopeSpecial)
	switch {
	case s.digests(key) && !isUUID(key):
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
func (s *Store) compactKey(scope, key string) string {
	var buf [128]byte
	sum := sha256.Sum256(s.appendLayout(buf[:0], scope, key))
	b := make([]byte, 0, len(s.cfg.Prefix)+compactLen)
	b = append(b, s.cfg.Prefix...)
	b = append(b, sum[:compactLen]...)
	return bytesToString(b)
}

// digests reports whether key is stored as a digest under the config.
func (s *Store) digests(key string) bool {
	return s.cfg.DigestKeysLongerThan > 0 && len(key) > s.cfg.DigestKeysLongerThan
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

// Value layout. A record is one Redis string:
//
//	processing  'p' ‖ token (tokenLen bytes) ‖ lease in ms (decimal)   PX 2×lease
//	done        "1"                  (no data)                          PX retention
//	done        'd' ‖ data                                              PX retention
//	done        'D' ‖ by (byLen bytes) ‖ data                           PX retention
//
// The lease is valid while PTTL > lease, so an expired processing record
// survives one more lease length and a takeover soon after expiry is seen as
// one. "1" is one of Redis's shared integer objects: a done record without
// data costs no value allocation at all (unless maxmemory-policy is an
// LRU/LFU one, which disables shared integers — and which must not be used
// anyway, see README).
//
// The 'D' form is written by a Complete of a claim whose keys live on
// several nodes (see fencedSharded): by, completedBy of the claim, lets a
// retry of a Complete cut part-way tell the keys it completed from keys
// done by another claim, and complete the rest.
const (
	tokenLen     = 26 // len(rand.Text())
	doneNoData   = "1"
	doneDataTag  = 'd'
	doneByTag    = 'D'
	processingID = 'p'
	byLen        = 8
)

// completedBy is what a 'D' done record keeps of the Complete that wrote
// it: the first byLen bytes of SHA-256 of the claim's token and its
// record keys, in the claim's order.
func completedBy(token string, rkeys []string) string {
	h := sha256.New()
	h.Write([]byte(token))
	for _, k := range rkeys {
		h.Write([]byte{0})
		h.Write([]byte(k))
	}
	return string(h.Sum(nil)[:byLen])
}

// doneBy returns the completeOp o writing the 'D' form of its done value,
// tagged with by.
func (o op) doneBy(by string) op {
	v := o.args[1].(string)
	data := ""
	if v != doneNoData {
		data = v[1:]
	}
	o.args = slices.Clone(o.args)
	o.args[1] = string(doneByTag) + by + data
	return o
}

// doneValue is the value Complete stores.
func doneValue(data []byte) string {
	if len(data) == 0 {
		return doneNoData
	}
	b := make([]byte, 1+len(data))
	b[0] = doneDataTag
	copy(b[1:], data)
	return string(b)
}

// processingValue is the value Claim and Extend store.
func processingValue(token string, leaseMS int64) string {
	b := make([]byte, 0, 1+len(token)+20)
	b = append(b, processingID)
	b = append(b, token...)
	return bytesToString(strconv.AppendInt(b, leaseMS, 10))
}

// bytesToString returns b as a string without copying it; b must not be
// changed afterwards.
func bytesToString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// record is a decoded value.
type record struct {
	processing bool
	token      string // processing only
	data       []byte // done only
	by         string // done in the 'D' form only: completedBy
}

// decodeValue decodes a value written by this package. Anything else under
// the store's prefix is an error, never a guess: a wrong guess would ack a
// message or run a handler twice.
func decodeValue(v string) (record, error) {
	switch {
	case v == doneNoData:
		return record{}, nil
	case len(v) > 0 && v[0] == doneDataTag:
		return record{data: []byte(v[1:])}, nil
	case len(v) > byLen && v[0] == doneByTag:
		rec := record{by: v[1 : 1+byLen]}
		if len(v) > 1+byLen {
			rec.data = []byte(v[1+byLen:])
		}
		return rec, nil
	case len(v) > 1+tokenLen && v[0] == processingID:
		return record{processing: true, token: v[1 : 1+tokenLen]}, nil
	default:
		n := min(len(v), 16)
		return record{}, fmt.Errorf("redisstore: a key under the store's prefix holds a value this store did not write (%q…)", v[:n])
	}
}

// ms converts d to whole milliseconds, rounding up so that a positive
// duration never becomes 0 (PX 0 is an error). It cannot overflow: the
// longest duration, math.MaxInt64 (about 292 years), is 9.2e12 ms, and
// twice that, the PX of a processing record, is still exact in a Lua
// number (a double) and far below the server's limit.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// The scripts. Each runs atomically on one node. In Redis Cluster every
// key of one call must hash to one slot; the Store guarantees that (see
// cluster.go). Lua sees a missing key as false.
var (
	// claimScript claims every key of KEYS, or none.
	//
	//	ARGV[1] token, ARGV[2] lease ms, ARGV[3] PX (2×lease)
	//
	// Reply:
	//	{1, i, prev, pttl, ...} claimed; one triple per record taken over
	//	                        (key index, previous value, its PTTL), so
	//	                        a caller can undo the claim exactly
	//	{2, i, value}           key i (the first such in KEYS order) is done
	//	{3}                     a key is processing under a live lease
	//
	// A record already processing under this very token counts as free:
	// a retried Claim whose first reply was lost gets its claim back.
	claimScript = redis.NewScript(expandLua(`
local token, busy, taken = ARGV[1], false, {1}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v then
    if string.byte(v, 1) ~= P then
      return {2, i, v}
    end
    if string.sub(v, 2, TOKEN_END) ~= token then
      local pttl = redis.call('PTTL', k)
      if pttl > tonumber(string.sub(v, LEASE_START)) then
        busy = true
      else
        taken[#taken + 1] = i
        taken[#taken + 1] = v
        taken[#taken + 1] = pttl
      end
    end
  end
end
if busy then
  return {3}
end
local rec = 'p' .. token .. ARGV[2]
for _, k in ipairs(KEYS) do
  redis.call('SET', k, rec, 'PX', ARGV[3])
end
return taken
`))

	// setScript overwrites every key of KEYS with ARGV[2] for ARGV[3] ms,
	// if every key is processing under token ARGV[1]; otherwise it changes
	// nothing. Complete (done value, retention), Extend (processing value,
	// 2×lease) and the undo of a takeover use it.
	//
	// Reply: 0 when applied, else the index of the first key not owned.
	//
	// With ARGV[4] (Config.WaitReplicas), a key not owned that exists
	// gets its own expiry set again (unchanged, to the millisecond), a
	// write that reaches the replication stream after whatever wrote
	// the record: the WAIT that follows then confirms that the record
	// which made the call fail is on the replicas too (see
	// refusalTouch).
	setScript = redis.NewScript(expandLua(`
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v or string.byte(v, 1) ~= P or string.sub(v, 2, TOKEN_END) ~= ARGV[1] then
    TOUCH(ARGV[4])
    return i
  end
end
for _, k in ipairs(KEYS) do
  redis.call('SET', k, ARGV[2], 'PX', ARGV[3])
end
return 0
`))

	// putBackScript puts ARGV[2] back on KEYS[1] for ARGV[3] ms if the key
	// holds ARGV[1] or nothing (see putBackOp). Reply: 0 when put back,
	// 1 when left alone.
	putBackScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 0
end
return 1
`)

	// delScript deletes every key of KEYS if every key is processing under
	// token ARGV[1]; otherwise it changes nothing. Same reply as setScript,
	// and ARGV[2] is setScript's ARGV[4].
	delScript = redis.NewScript(expandLua(`
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v or string.byte(v, 1) ~= P or string.sub(v, 2, TOKEN_END) ~= ARGV[1] then
    TOUCH(ARGV[2])
    return i
  end
end
redis.call('DEL', unpack(KEYS))
return 0
`))
)

// refusalTouch is the Lua of TOUCH(flag) in the fenced scripts: when flag
// is set and the key k that refuses the call exists, its expiry is set
// again to what it is. It changes nothing a reader can see (the time
// of a script is fixed while it runs, so PTTL then PEXPIRE gives the key
// the expiry it had), but it is a write: Redis propagates it, after
// every earlier write of the key, so a WAIT that follows on the same
// connection covers the record the refusal was read from. A key
// without a TTL (not this store's) is left alone.
const refusalTouch = `if FLAG and v then
      local ttl = redis.call('PTTL', k)
      if ttl > 0 then
        redis.call('PEXPIRE', k, ttl)
      end
    end`

// expandLua writes the value layout's constants into a script.
func expandLua(src string) string {
	return strings.NewReplacer(
		"TOKEN_END", strconv.Itoa(1+tokenLen),
		"LEASE_START", strconv.Itoa(2+tokenLen),
		"~= P", "~= "+strconv.Itoa(processingID),
		"TOUCH(ARGV[2])", strings.ReplaceAll(refusalTouch, "FLAG", "ARGV[2]"),
		"TOUCH(ARGV[4])", strings.ReplaceAll(refusalTouch, "FLAG", "ARGV[4]"),
	).Replace(src)
}

// op is one script call, or (script nil) the plain command of
// claimSetOp. Every Store method is one op (or, for a multi-key claim in
// Redis Cluster, one op per key; a single-key claim may be two).
type op struct {
	script *redis.Script
	keys   []string
	args   []any

	// nowait: with WaitReplicas, what it writes need not be confirmed
	// by the WAIT of its own pipeline (a multi-key claim in Cluster
	// confirms its keys together, see claimOrdered).
	nowait bool
	// trace notes, for the store call the op is part of, that a WAIT
	// held it up (see cutByWait); nil without WaitReplicas.
	trace *waitTrace
}

// claimSetOp takes key if it is free, and returns what it holds otherwise:
//
//	SET key processing NX GET PX 2×lease
//
// Reply: nil (redis.Nil) when it took the key, else the value it holds,
// unchanged. Redis 7.0 and later; older servers refuse NX with GET.
func claimSetOp(key, token string, lease time.Duration) op {
	l := ms(lease)
	return op{args: []any{"set", key, processingValue(token, l), "px", 2 * l, "nx", "get"}}
}

// setKey and setValue return the key and value of a claimSetOp.
func (o op) setKey() string   { return o.args[1].(string) }
func (o op) setValue() string { return o.args[2].(string) }

func claimOp(keys []string, token string, lease time.Duration) op {
	l := ms(lease)
	return op{script: claimScript, keys: keys, args: []any{token, strconv.FormatInt(l, 10), strconv.FormatInt(2*l, 10)}}
}

func completeOp(keys []string, token string, retention time.Duration, data []byte) op {
	return op{script: setScript, keys: keys, args: []any{token, doneValue(data), strconv.FormatInt(ms(retention), 10)}}
}

func extendOp(keys []string, token string, lease time.Duration) op {
	l := ms(lease)
	return op{script: setScript, keys: keys, args: []any{token, processingValue(token, l), strconv.FormatInt(2*l, 10)}}
}

func releaseOp(keys []string, token string) op {
	return op{script: delScript, keys: keys, args: []any{token}}
}

// putBackOp undoes this store's own write of written on key (a claim's
// processing record, a Complete's done record; "" for a Release's delete):
// it puts prev back for pttl ms if the key still holds written, or holds
// nothing (our write expired since, or was a delete). A key someone else
// wrote since is left alone.
func putBackOp(key, written, prev string, pttl int64) op {
	return op{script: putBackScript, keys: []string{key}, args: []any{written, prev, strconv.FormatInt(max(pttl, 1), 10)}}
}

// claimReply is a decoded claimScript reply.
type claimReply struct {
	result int64    // 1 claimed, 2 duplicate, 3 in progress
	index  int      // duplicate: index into keys of the done record
	value  string   // duplicate: its value
	taken  []prevOf // claimed: records taken over
}

// prevOf is a record a claim took over.
type prevOf struct {
	index int
	value string
	pttl  int64
}

func parseClaim(v any) (claimReply, error) {
	bad := func() (claimReply, error) {
		return claimReply{}, fmt.Errorf("redisstore: unexpected claim reply %v", v)
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return bad()
	}
	res, ok := a[0].(int64)
	if !ok {
		return bad()
	}
	r := claimReply{result: res}
	switch res {
	case 1:
		if (len(a)-1)%3 != 0 {
			return bad()
		}
		for i := 1; i < len(a); i += 3 {
			idx, ok1 := a[i].(int64)
			val, ok2 := a[i+1].(string)
			pttl, ok3 := a[i+2].(int64)
			if !ok1 || !ok2 || !ok3 {
				return bad()
			}
			r.taken = append(r.taken, prevOf{int(idx) - 1, val, pttl})
		}
	case 2:
		if len(a) != 3 {
			return bad()
		}
		idx, ok1 := a[1].(int64)
		val, ok2 := a[2].(string)
		if !ok1 || !ok2 {
			return bad()
		}
		r.index, r.value = int(idx)-1, val
	case 3:
	default:
		return bad()
	}
	return r, nil
}

// parseFenced decodes a setScript/delScript reply: -1 when applied, else
// the index into keys of the first key not owned.
func parseFenced(v any) (int, error) {
	n, ok := v.(int64)
	if !ok || n < 0 {
		return 0, fmt.Errorf("redisstore: unexpected reply %v", v)
	}
	return int(n) - 1, nil
}

// The inverse of the key layout, for the admin interface (admin.go).

// decodeKey returns the (scope, key) a Redis key of this store stands
// for, as far as the layout keeps them: nothing with CompactKeys, the
// scope alone for a digested key. A key under the prefix that this store
// would not have written (its re-encoding differs) decodes to nothing.
func (s *Store) decodeKey(rkey string) (scope, key string, scopeOK, keyOK bool) {
	rest, ok := strings.CutPrefix(rkey, s.cfg.Prefix)
	if !ok || s.cfg.CompactKeys {
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
	if s.encodeKey(scope, key) != rkey {
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
func (s *Store) matchPattern(scope string, byScope bool) string {
	if !byScope {
		return globEscape(s.cfg.Prefix) + "*"
	}
	esc := appendEscaped(nil, scope, isScopeSpecial)
	return globEscape(s.cfg.Prefix+string(esc)) + "[" + string([]byte{kindRaw, kindUUID, kindDigest}) + "]*"
}

// leaseMS returns the lease, in milliseconds, of a processing value.
func leaseMS(v string) (int64, error) {
	n, err := strconv.ParseInt(v[1+tokenLen:], 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("redisstore: a processing record with a malformed lease (%q…)", v[:min(len(v), 16)])
	}
	return n, nil
}

// The admin scripts. Each touches one key.
var (
	// readScript reads a record and its remaining TTL at once.
	//
	// Reply: {} when the key does not exist, else {value, PTTL in ms}.
	readScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
return {v, redis.call('PTTL', KEYS[1])}
`)

	// peekScript reads what Stats needs of a record: the start of its
	// value (the state, a processing record's lease), its remaining TTL,
	// and its memory use (-1 when MEMORY USAGE is refused).
	//
	// Reply: {} when the key does not exist, else {head, PTTL, bytes}.
	peekScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local m = redis.pcall('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
if type(m) ~= 'number' then
  m = -1
end
return {string.sub(v, 1, 64), redis.call('PTTL', KEYS[1]), m}
`)

	// deleteStateScript deletes KEYS[1] if it holds a processing record
	// (ARGV[1] = "p") or a done one (ARGV[1] = "d").
	//
	// Reply: {} when the key does not exist, else {1 deleted or 0 in the
	// other state, value, PTTL in ms}.
	deleteStateScript = redis.NewScript(expandLua(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
if (string.byte(v, 1) ~= P) == (ARGV[1] == 'd') then
  redis.call('DEL', KEYS[1])
  return {1, v, pttl}
end
return {0, v, pttl}
`))
)
