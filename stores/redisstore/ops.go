package redisstore

import (
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

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

// firstKey is the key that decides o's node.
func (o op) firstKey() string {
	if o.script == nil {
		return o.setKey()
	}
	return o.keys[0]
}

// claimSetOp takes key if it is free, and returns what it holds otherwise:
//
//	SET key processing NX GET PX 2×lease
//
// Reply: nil (redis.Nil) when it took the key, else the value it holds,
// unchanged. Redis 7.0 and later; older servers refuse NX with GET.
func claimSetOp(key, token string, lease time.Duration, suffix string) op {
	l := ms(lease)
	return op{args: []any{"set", key, processingValue(token, l, suffix), "px", 2 * l, "nx", "get"}}
}

// setKey and setValue return the key and value of a claimSetOp.
func (o op) setKey() string { return o.args[1].(string) }

func (o op) setValue() string { return o.args[2].(string) }

// claimOp claims keys under token; suffix is the owner's (ownerSuffix).
func claimOp(keys []string, token string, lease time.Duration, suffix string) op {
	l := ms(lease)
	return op{script: claimScript, keys: keys, args: []any{token, strconv.FormatInt(l, 10), strconv.FormatInt(2*l, 10), suffix}}
}

func completeOp(keys []string, token string, retention time.Duration, data []byte) op {
	return op{script: setScript, keys: keys, args: []any{token, doneValue(data), strconv.FormatInt(ms(retention), 10)}}
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

func extendOp(keys []string, token string, lease time.Duration) op {
	l := ms(lease)
	return op{script: setScript, keys: keys, args: []any{token, processingValue(token, l, ""), strconv.FormatInt(2*l, 10)}}
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

// touching returns o with the flag that makes a fenced script confirm
// its refusal (see refusalTouch); other ops are returned as they are.
func (o op) touching() op {
	if o.script == setScript || o.script == delScript {
		o.args = append(o.args[:len(o.args):len(o.args)], "1")
	}
	return o
}

// heldKey is a key a claim in progress took, and what it held before.
type heldKey struct {
	key      string
	prev     prevOf
	tookOver bool
	at       time.Time // when the reply that took it over arrived
}

// undoOps returns the ops that undo a claim of heldKeys under token, whose
// records were written as written. A key taken over gets its previous record back, with what was left
// of its TTL when the takeover read it (less the time since, rounded down:
// an expired lease stays expired, and the record is forgotten no sooner
// than it would have been), also when our own record, of a shorter lease,
// has expired meanwhile.
func undoOps(token, written string, heldKeys []heldKey) []op {
	ops := make([]op, len(heldKeys))
	for i, h := range heldKeys {
		if h.tookOver && h.prev.pttl > 0 {
			ops[i] = putBackOp(h.key, written, h.prev.value, h.prev.pttl-time.Since(h.at).Milliseconds())
		} else {
			ops[i] = releaseOp([]string{h.key}, token)
		}
	}
	return ops
}

// claimUndo returns the ops that give back what the claim op o took, by
// its answer v, err (none for an op that is not a claim, or took
// nothing): a key that was free is deleted, a key taken over from an
// expired lease gets its previous record back.
func claimUndo(o op, v any, err error) []op {
	if o.script == nil {
		if !errors.Is(err, redis.Nil) {
			return nil
		}
		// claimSetOp took the key.
		token := o.setValue()[1 : 1+tokenLen]
		return []op{releaseOp([]string{o.setKey()}, token)}
	}
	if err != nil || o.script != claimScript {
		return nil
	}
	r, err := parseClaim(v)
	if err != nil || r.result != 1 {
		return nil
	}
	held := make([]heldKey, len(o.keys))
	now := time.Now()
	for i, k := range o.keys {
		held[i].key, held[i].at = k, now
	}
	for _, p := range r.taken {
		held[p.index].prev, held[p.index].tookOver = p, true
	}
	token, leaseMS, suffix := o.args[0].(string), o.args[1].(string), o.args[3].(string)
	return undoOps(token, string(processingID)+token+leaseMS+suffix, held)
}

// undoTimeout bounds the undo of a claim whose caller gave up, and is
// the least time an undo is given (a claim's lease may be shorter than
// a round trip).
const undoTimeout = 2 * time.Second
