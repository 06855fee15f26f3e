package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

func (c *cli) exec(ctx context.Context, cmd string, pos []string) error {
	if err := c.checkArgs(cmd, pos); err != nil {
		return err
	}
	if cmd == "window" {
		return c.window()
	}
	a, err := openStore(ctx, c.cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = a.close(cctx)
	}()
	switch cmd {
	case "stats":
		return c.stats(ctx, a)
	case "get":
		return c.get(ctx, a, c.named(pos))
	case "list":
		var scope string
		if len(pos) == 1 {
			scope = pos[0]
		}
		return c.list(ctx, a, scope)
	case "forget":
		return c.remove(ctx, a, stores.StateDone, pos)
	case "release":
		return c.remove(ctx, a, stores.StateProcessing, pos)
	default: // purge
		return c.purge(ctx, a)
	}
}

// checkArgs checks a command's arguments before anything connects.
func (c *cli) checkArgs(cmd string, pos []string) error {
	n := len(pos)
	switch cmd {
	case "get":
		switch {
		case c.cfg.id != "" && n != 0:
			return usagef("get takes SCOPE KEY or -id, not both")
		case c.cfg.id == "" && n != 2:
			return usagef("get takes SCOPE and KEY (or -id=ID), got %s", argCount(n))
		}
	case "list":
		if n > 1 {
			return usagef("list takes at most a SCOPE, got %s", argCount(n))
		}
	case "forget", "release":
		switch {
		case c.cfg.id != "" && n != 0:
			return usagef("%s takes SCOPE KEY or -id, not both", cmd)
		case c.cfg.id != "" && (c.cfg.keyPrefix != "" || c.cfg.all):
			return usagef("%s -id names one record: it takes no -prefix or -all", cmd)
		case c.cfg.id != "":
		case n < 1 || n > 2:
			return usagef("%s takes SCOPE and KEY (or SCOPE and -prefix), got %s", cmd, argCount(n))
		case n == 2 && c.cfg.keyPrefix != "":
			return usagef("%s takes KEY or -prefix, not both", cmd)
		case n == 1 && c.cfg.keyPrefix == "" && !c.cfg.all:
			return usagef("%s needs the KEY, or -prefix=KEY_PREFIX, or -all for every record of scope %+q", cmd, pos[0])
		case n == 1 && pos[0] == "":
			// A listing without a scope lists every scope: -all would
			// reach far beyond what the operator named.
			return usagef("%s with -prefix or -all needs a SCOPE: an empty one would select the records of every scope", cmd)
		}
	case "window":
		if n != 0 {
			return usagef("window takes no arguments, got %s", argCount(n))
		}
		return c.cfg.checkWindow()
	default: // stats, purge
		if n != 0 {
			return usagef("%s takes no arguments, got %s", cmd, argCount(n))
		}
	}
	return nil
}

// notByScope turns ErrNotSupported into the explanation of what does not
// work, why, and what does.
func notByScope(cmd string, a *admin, err error) error {
	if errors.Is(err, stores.ErrNotSupported) {
		return &usageError{fmt.Sprintf("%s cannot select records by scope or key on %s: %s", cmd, a.where, digestNote)}
	}
	return err
}

// named is the record pos (SCOPE KEY) or -id names.
func (c *cli) named(pos []string) recordRef {
	if c.cfg.id != "" {
		return recordRef{id: c.cfg.id}
	}
	return recordRef{scope: pos[0], key: pos[1]}
}

func (c *cli) get(ctx context.Context, a *admin, o recordRef) error {
	r, err := o.get(ctx, a)
	if errors.Is(err, stores.ErrNotFound) {
		msg := fmt.Sprintf("no record %s on %s", o, a.where)
		if o.id != "" {
			msg += "\n(-id takes a record's id, as list prints it, not a message's id: `dedupctl get SCOPE KEY` finds a message's record by its key)"
		}
		return &notFoundError{msg}
	}
	if err != nil {
		return err
	}
	if c.cfg.json {
		return writeJSON(c.out, recordView(r))
	}
	writeRecord(c.out, r, time.Now())
	return nil
}

func (c *cli) list(ctx context.Context, a *admin, scope string) error {
	opts := stores.ListOptions{Scope: scope, KeyPrefix: c.cfg.keyPrefix, After: c.cfg.after, Limit: c.cfg.limit}
	if c.cfg.state != "" {
		opts.State, _ = stores.ParseRecordState(c.cfg.state) // validated
	}
	recs, next, err := a.List(ctx, opts)
	if err != nil {
		return notByScope("list", a, err)
	}
	if c.cfg.json {
		return writeJSON(c.out, listJSON{Records: views(recs), Next: next})
	}
	if len(recs) == 0 {
		fmt.Fprintf(c.out, "no records on %s\n", a.where)
		return nil
	}
	writeRecords(c.out, recs, time.Now())
	if next != "" {
		fmt.Fprintf(c.out, "\nmore records: add -after=%s\n", next)
	}
	if slices.ContainsFunc(recs, func(r stores.Record) bool { return !r.KeyKnown }) {
		fmt.Fprintf(c.out, "\nget, forget (done) or release (processing) one of them by its ID: dedupctl get -id=ID, dedupctl release -id=ID -yes\n")
	}
	return nil
}

// listJSON is a page of list for -json.
type listJSON struct {
	Records []recordJSON `json:"records"`
	// Next is the cursor of the next page, absent after the last.
	Next string `json:"next,omitempty"`
}

// remove is forget (want done) and release (want processing).
func (c *cli) remove(ctx context.Context, a *admin, want stores.RecordState, pos []string) error {
	verb := "forget"
	if want == stores.StateProcessing {
		verb = "release"
	}
	single := c.cfg.id != "" || len(pos) == 2
	var targets []stores.Record
	if single {
		o := c.named(pos)
		r, err := o.get(ctx, a)
		if err != nil {
			return removeError(verb, a, o, r, err)
		}
		if r.State != want {
			return wrongState(verb, r)
		}
		targets = []stores.Record{r}
	} else {
		scope := pos[0]
		recs, err := listAll(ctx, a, stores.ListOptions{Scope: scope, KeyPrefix: c.cfg.keyPrefix, State: want})
		if err != nil {
			return notByScope(verb, a, err)
		}
		sel := fmt.Sprintf("scope %+q", scope)
		if c.cfg.keyPrefix != "" {
			sel = fmt.Sprintf("scope %+q with a key starting %+q", scope, c.cfg.keyPrefix)
		}
		if len(recs) == 0 {
			return &notFoundError{fmt.Sprintf("no %s record in %s on %s: nothing to %s", want, sel, a.where, verb)}
		}
		if len(recs) > 1 && !c.cfg.all {
			if c.cfg.json {
				return &refusedError{fmt.Sprintf("%d %s records in %s: add -all to %s them all; nothing deleted", len(recs), want, sel, verb)}
			}
			shown := recs[:min(len(recs), 10)]
			writeRecords(c.out, shown, time.Now())
			return &refusedError{fmt.Sprintf("%d %s records in %s (%d shown above): add -all to %s them all; nothing deleted", len(recs), want, sel, len(shown), verb)}
		}
		targets = recs
	}

	if !c.cfg.yes {
		if c.cfg.json {
			if err := writeJSON(c.out, removeResult{WouldDelete: views(targets)}); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(c.out, "would %s %d %s on %s:\n", verb, len(targets), plural(len(targets), "record", "records"), a.where)
			writeRecordTable(c.out, targets, time.Now(), c.cfg.id != "")
		}
		return &refusedError{fmt.Sprintf("nothing deleted: add -yes to %s %s", verb, plural(len(targets), "this record", "these records"))}
	}

	if single {
		o := c.named(pos)
		r, err := o.delete(ctx, a, want)
		if err != nil {
			return removeError(verb, a, o, r, err)
		}
		return c.writeRemoved(verb, removeResult{Deleted: []recordJSON{recordView(r)}})
	}
	var res removeResult
	for _, t := range targets {
		// By the ID listed: a key stored as a digest has no other way.
		r, err := a.DeleteByID(ctx, t.ID, want)
		switch {
		case err == nil:
			res.Deleted = append(res.Deleted, recordView(keep(r, t)))
		case errors.Is(err, stores.ErrNotFound):
			res.Skipped = append(res.Skipped, skipped{recordView(t), "gone since it was listed"})
		case errors.Is(err, stores.ErrWrongState):
			res.Skipped = append(res.Skipped, skipped{recordView(keep(r, t)), "it is " + r.State.String() + " now"})
		default:
			if werr := c.writeRemoved(verb, res); werr != nil {
				return werr
			}
			return fmt.Errorf("%s stopped after %d of %d records: %w", verb, len(res.Deleted), len(targets), err)
		}
	}
	return c.writeRemoved(verb, res)
}

// keep fills in r the scope and key its listing t knew.
func keep(r, t stores.Record) stores.Record {
	if !r.ScopeKnown && t.ScopeKnown {
		r.Scope, r.ScopeKnown = t.Scope, true
	}
	if !r.KeyKnown && t.KeyKnown {
		r.Key, r.KeyKnown = t.Key, true
	}
	return r
}

// removeError explains the failure of a forget or release of one record.
func removeError(verb string, a *admin, o recordRef, r stores.Record, err error) error {
	switch {
	case errors.Is(err, stores.ErrNotFound):
		return &notFoundError{fmt.Sprintf("no record %s on %s: nothing to %s", o, a.where, verb)}
	case errors.Is(err, stores.ErrWrongState):
		return wrongState(verb, r)
	}
	return err
}

// writeRemoved prints what a forget or release deleted and skipped.
func (c *cli) writeRemoved(verb string, res removeResult) error {
	if c.cfg.json {
		return writeJSON(c.out, res)
	}
	past := map[string]string{"forget": "forgot", "release": "released"}[verb]
	now := time.Now()
	for _, r := range res.Deleted {
		fmt.Fprintf(c.out, "%s %s\n", past, describe(r, now))
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(c.out, "skipped %s: %s\n", describe(s.Record, now), s.Reason)
	}
	return nil
}

// wrongState is the refusal to forget a processing record or release a
// done one.
func wrongState(verb string, r stores.Record) error {
	now := time.Now()
	name := "the record with id " + r.ID
	if r.KeyKnown {
		name = fmt.Sprintf("the record for key %+q in scope %+q", r.Key, r.Scope)
	}
	if r.State == stores.StateProcessing {
		return &refusedError{fmt.Sprintf("%s is processing (a claim under token %s, lease until %s): forget deletes done records; release frees a claim; nothing deleted",
			name, r.Token, fmtTime(r.LeaseUntil, now))}
	}
	return &refusedError{fmt.Sprintf("%s is done (expires at %s): release frees processing claims; forget deletes a done record so its message is processed again; nothing deleted",
		name, fmtTime(r.ExpiresAt, now))}
}

type removeResult struct {
	WouldDelete []recordJSON `json:"would_delete,omitempty"`
	Deleted     []recordJSON `json:"deleted,omitempty"`
	Skipped     []skipped    `json:"skipped,omitempty"`
}

type skipped struct {
	Record recordJSON `json:"record"`
	Reason string     `json:"reason"`
}

// listAll lists every page of opts.
func listAll(ctx context.Context, a *admin, opts stores.ListOptions) ([]stores.Record, error) {
	opts.Limit = stores.MaxListLimit
	var out []stores.Record
	seen := map[string]bool{}
	for {
		recs, next, err := a.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if !seen[r.ID] { // a SCAN may list a record twice
				seen[r.ID] = true
				out = append(out, r)
			}
		}
		if next == "" {
			return out, nil
		}
		opts.After = next
	}
}

// purgeJSON is purge's answer for -json.
type purgeJSON struct {
	Purged int64 `json:"purged"`
}

func (c *cli) purge(ctx context.Context, a *admin) error {
	n, err := a.Purge(ctx)
	if err != nil {
		return err
	}
	if c.cfg.json {
		return writeJSON(c.out, purgeJSON{n})
	}
	if c.cfg.store == storeRedis {
		fmt.Fprintf(c.out, "nothing to purge on %s: Redis deletes expired records by itself\n", a.where)
		return nil
	}
	fmt.Fprintf(c.out, "purged %d expired %s on %s\n", n, plural(int(n), "record", "records"), a.where)
	return nil
}

func (c *cli) stats(ctx context.Context, a *admin) error {
	st, err := a.Stats(ctx)
	if err != nil {
		return err
	}
	if c.cfg.json {
		return writeJSON(c.out, statsView(a.where, st))
	}
	writeStats(c.out, a, st, time.Now())
	return nil
}
