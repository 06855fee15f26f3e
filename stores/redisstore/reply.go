package redisstore

import "fmt"

// The replies of the scripts, decoded.

// claimReply is a decoded claimScript reply.
type claimReply struct {
	result int64    // 1 claimed, 2 duplicate, 3 in progress
	index  int      // duplicate: index into keys of the done record
	value  string   // duplicate: its value; in progress: a held record's, when the reply has one
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
		if len(a) == 2 {
			val, ok := a[1].(string)
			if !ok {
				return bad()
			}
			r.value = val
		}
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

// parseRead decodes a readScript reply (or the tail of a
// deleteStateScript one): ok is false when the key did not exist.
func parseRead(v any) (value string, pttl int64, ok bool, err error) {
	a, isList := v.([]any)
	switch {
	case isList && len(a) == 0:
		return "", 0, false, nil
	case isList && len(a) == 2:
		value, ok1 := a[0].(string)
		pttl, ok2 := a[1].(int64)
		if ok1 && ok2 {
			return value, pttl, true, nil
		}
	}
	return "", 0, false, fmt.Errorf("redisstore: unexpected reply %v", v)
}
