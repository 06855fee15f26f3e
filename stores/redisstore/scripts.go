package redisstore

import (
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts. Each runs atomically on one node. In Redis Cluster every
// key of one call must hash to one slot; the Store guarantees that (see
// claimOrdered and fencedSharded). Lua sees a missing key as false.
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
