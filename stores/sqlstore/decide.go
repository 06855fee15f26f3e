package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// The claim decision: the state machine of the stores package applied to
// the records a claim or Begin reads, on every path that decides one (the
// lone claim, the transaction of a multi-key claim or a takeover, each
// dialect's batch, Begin).

// decide applies the state machine (see the stores package) to recs,
// the existing records of the ids of a claim, or of a Begin, in the
// caller's key order, for a claim under token (0 for a Begin, which has
// none):
//
//   - a live done record makes Duplicate, with the data of the first in
//     order;
//   - else a live processing record that is not the claim's own makes
//     InProgress;
//   - else, when every record is the claim's own (an earlier attempt
//     wrote it) or there is none, Claimed: nothing is left to do;
//   - else 0: the records that are not the claim's own have expired, and
//     the claim takes them over; takeover reports that one of them was
//     processing (an expired lease, worth reporting).
//
// owner is, for InProgress, the owner kept by the first held record that
// keeps one, and for a takeover the first expired processing record's
// (see stores.OwnerClaimer: a processing record keeps it as its data).
//
// Every path that decides a claim or a Begin asks it: the lone claim,
// the transaction of a multi-key claim or a takeover, each dialect's
// batch, and Begin.
func decide(recs map[string]record, order []string, token int64) (res stores.Result, data, owner []byte, takeover bool) {
	ours := func(r record) bool { return token != 0 && r.state == stateProcessing && r.token == token }
	for _, k := range order {
		if r, ok := recs[k]; ok && r.live && r.state == stateDone {
			return stores.Duplicate, r.data, nil, false
		}
	}
	var held, expired []byte // the owners of the first held and expired records that keep one
	free, busy := true, false
	for _, k := range order {
		r, ok := recs[k]
		switch {
		case !ok || ours(r):
		case r.live:
			busy = true
			if held == nil && len(r.data) > 0 {
				held = r.data
			}
		default:
			free = false
			if r.state == stateProcessing {
				takeover = true
				if expired == nil && len(r.data) > 0 {
					expired = r.data
				}
			}
		}
	}
	switch {
	case busy:
		return stores.InProgress, nil, held, false
	case free:
		return stores.Claimed, nil, nil, false
	}
	return 0, nil, expired, takeover
}

// settle decides, from its existing record r, a batched claim that did
// not insert its row: Claimed (the record is its own), Duplicate or
// InProgress, or, when it returns true, an expired record the claim must
// take over, under a lock.
func settle(o *op, r record) (takeover bool) {
	res, data, owner, _ := decide(map[string]record{"": r}, []string{""}, o.token)
	o.res.Result, o.res.Data = res, data
	if res == stores.InProgress {
		o.res.Owner = owner
	}
	return res == 0
}

// applied records the rows affected by o's statement: a claim that
// inserted its record is Claimed (one that did not is returned as a
// conflict, to be settled); a fenced call that matched nothing lost its
// claim.
func applied(o *op, n int64) (conflict bool) {
	switch {
	case o.kind == opClaim && n == 1:
		o.res.Result = stores.Claimed
	case o.kind == opClaim:
		return true
	case n != 1:
		o.err = lostClaim(o.claim)
	}
	return false
}

// claimLocked ends a batched claim that found its record r (ok: it
// exists), locked in tx: a record deleted since the INSERT found it sends
// the claim on to run alone; a live one settles it (Duplicate or
// InProgress); an expired one is taken over (SQLite: the transaction holds
// the database's write lock).
func claimLocked(ctx context.Context, tx *sql.Tx, d dialect, o *op, r record, ok bool, now time.Time) error {
	if !ok {
		o.fallback = true
		return nil
	}
	if !settle(o, r) {
		return nil
	}
	if _, err := tx.ExecContext(ctx, d.sql().takeover(1), o.token, d.timeArg(now.Add(o.d)), nil, d.idArg(o.id())); err != nil {
		return err
	}
	o.res.Result, o.res.Takeover = stores.Claimed, r.state == stateProcessing
	if o.res.Takeover && len(r.data) > 0 {
		o.res.Owner = r.data
	}
	return nil
}

// lostClaim is the error of a fenced call whose token no longer owns its
// records.
func lostClaim(c *stores.Claim) error {
	return fmt.Errorf("%w: scope %q keys %q", stores.ErrLostClaim, c.Scope, c.Keys)
}
