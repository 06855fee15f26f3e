package redisstore

import (
	_ "embed"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua sources of the scripts, in scripts/. Each is documented at its
// script below.
var (
	//go:embed scripts/claim.lua
	claimLua string
	//go:embed scripts/set.lua
	setLua string
	//go:embed scripts/put_back.lua
	putBackLua string
	//go:embed scripts/del.lua
	delLua string
	//go:embed scripts/touch.lua
	touchLua string
	//go:embed scripts/read.lua
	readLua string
	//go:embed scripts/peek.lua
	peekLua string
	//go:embed scripts/delete_state.lua
	deleteStateLua string
)

// The scripts. Each runs atomically on one node. In Redis Cluster every
// key of one call must hash to one slot; the Store guarantees that (see
// claimOrdered and fencedSharded). Lua sees a missing key as false.
var (
	// claimScript claims every key of KEYS, or none.
	//
	//	ARGV[1] token, ARGV[2] lease ms, ARGV[3] PX (2×lease),
	//	ARGV[4] the owner's suffix of the processing value ("" for none)
	//
	// Reply:
	//	{1, i, prev, pttl, ...} claimed; one triple per record taken over
	//	                        (key index, previous value, its PTTL), so
	//	                        a caller can undo the claim exactly
	//	{2, i, value}           key i (the first such in KEYS order) is done
	//	{3, value}              a key is processing under a live lease:
	//	                        the first such keeping an owner, or else
	//	                        the last
	//
	// A record already processing under this very token counts as free:
	// a retried Claim whose first reply was lost gets its claim back.
	claimScript = redis.NewScript(expandLua(claimLua))

	// setScript overwrites every key of KEYS with ARGV[2] for ARGV[3] ms,
	// if every key is processing under token ARGV[1]; otherwise it changes
	// nothing. Complete (done value, retention), Extend (processing value,
	// 2×lease) and the undo of a takeover use it. A processing value is
	// written with the owner's suffix the key's record keeps.
	//
	// Reply: 0 when applied, else the index of the first key not owned.
	//
	// With ARGV[4] (Config.WaitReplicas), a key not owned that exists
	// gets its own expiry set again (unchanged, to the millisecond), a
	// write that reaches the replication stream after whatever wrote
	// the record: the WAIT that follows then confirms that the record
	// which made the call fail is on the replicas too (see
	// refusalTouch).
	setScript = redis.NewScript(expandLua(setLua))

	// putBackScript puts ARGV[2] back on KEYS[1] for ARGV[3] ms if the key
	// holds ARGV[1] or nothing (see putBackOp). Reply: 0 when put back,
	// 1 when left alone.
	putBackScript = redis.NewScript(putBackLua)

	// delScript deletes every key of KEYS if every key is processing under
	// token ARGV[1]; otherwise it changes nothing. Same reply as setScript,
	// and ARGV[2] is setScript's ARGV[4].
	delScript = redis.NewScript(expandLua(delLua))
)

// refusalTouch is the Lua of TOUCH(flag) in the fenced scripts
// (scripts/touch.lua, FLAG standing for flag): when flag is set and the
// key k that refuses the call exists, its expiry is set again to what it
// is. It changes nothing a reader can see (the time
// of a script is fixed while it runs, so PTTL then PEXPIRE gives the key
// the expiry it had), but it is a write: Redis propagates it, after
// every earlier write of the key, so a WAIT that follows on the same
// connection covers the record the refusal was read from. A key
// without a TTL (not this store's) is left alone.
var refusalTouch = strings.TrimSuffix(touchLua, "\n")

// expandLua writes the value layout's constants into a script.
func expandLua(src string) string {
	return strings.NewReplacer(
		"TOKEN_END", strconv.Itoa(1+tokenLen),
		"LEASE_START", strconv.Itoa(2+tokenLen),
		"~= P", "~= "+strconv.Itoa(processingID),
		"== P", "== "+strconv.Itoa(processingID),
		"TOUCH(ARGV[2])", strings.ReplaceAll(refusalTouch, "FLAG", "ARGV[2]"),
		"TOUCH(ARGV[4])", strings.ReplaceAll(refusalTouch, "FLAG", "ARGV[4]"),
	).Replace(src)
}

// The admin scripts. Each touches one key.
var (
	// readScript reads a record and its remaining TTL at once.
	//
	// Reply: {} when the key does not exist, else {value, PTTL in ms}.
	readScript = redis.NewScript(readLua)

	// peekScript reads what Stats needs of a record: the start of its
	// value (the state, a processing record's lease), its remaining TTL,
	// and its memory use (-1 when MEMORY USAGE is refused).
	//
	// Reply: {} when the key does not exist, else {head, PTTL, bytes}.
	peekScript = redis.NewScript(peekLua)

	// deleteStateScript deletes KEYS[1] if it holds a processing record
	// (ARGV[1] = "p") or a done one (ARGV[1] = "d").
	//
	// Reply: {} when the key does not exist, else {1 deleted or 0 in the
	// other state, value, PTTL in ms}.
	deleteStateScript = redis.NewScript(expandLua(deleteStateLua))
)
