// Package storekit holds what store implementations share beyond the
// contract in [stores]: the checks of a call's arguments, each returning
// nil or an error wrapping [stores.ErrInvalidKey] or
// [stores.ErrInvalidArgument] that says what was wrong. A store calls
// them before any I/O and wraps their error with its own prefix
// ("memstore: claim: ..."). Bounds of a store's own (a longest key, a
// longest lease) are in its [stores.Capabilities], whose Check methods
// it calls too.
package storekit

import (
	"context"
	"fmt"

	"github.com/watermill-dedup/dedup/stores"
)

// CheckCall returns the first reason a call must fail before any I/O,
// in the order of the contract's error classes: the store is closed
// ([stores.ErrClosed]), an argument check failed (args, the results of the
// checks below and of the store's own, in the order the call takes its
// arguments), or ctx is done. A store calls it first in every method:
//
//	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckKeys(keys), s.Capabilities().CheckLease(lease)); err != nil {
//		return nil, fmt.Errorf("mystore: claim: %w", err)
//	}
func CheckCall(ctx context.Context, closed bool, args ...error) error {
	if closed {
		return stores.ErrClosed
	}
	for _, err := range args {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// CheckKeys checks the keys of a Claim or Begin: at least one, none empty.
func CheckKeys(keys []string) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: no keys", stores.ErrInvalidKey)
	}
	for i, k := range keys {
		if k == "" {
			return fmt.Errorf("%w: key %d is empty", stores.ErrInvalidKey, i)
		}
	}
	return nil
}

// CheckClaim checks the claim handed to Complete, Release or Extend: a
// [stores.Claimed] result with a token and keys. Whether the token is one the
// store hands out is the store's to check.
func CheckClaim(c *stores.Claim) error {
	if c == nil || c.Result != stores.Claimed || c.Token == "" || len(c.Keys) == 0 {
		return fmt.Errorf("%w: not a Claimed claim", stores.ErrInvalidArgument)
	}
	if err := CheckKeys(c.Keys); err != nil {
		return fmt.Errorf("%w: the claim's keys are invalid: %w", stores.ErrInvalidArgument, err)
	}
	return nil
}

// CheckRecordKey checks the key of a Get or Delete: not empty.
func CheckRecordKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", stores.ErrInvalidKey)
	}
	return nil
}

// CheckState checks the state of a Delete: [stores.StateProcessing] or
// [stores.StateDone].
func CheckState(want stores.RecordState) error {
	if want != stores.StateProcessing && want != stores.StateDone {
		return fmt.Errorf("%w: state must be processing or done, got %s", stores.ErrInvalidArgument, want)
	}
	return nil
}

// CheckListOptions checks the options of a List and returns them with
// the default Limit filled in. Whether the layout can filter on Scope and
// KeyPrefix, and what a cursor holds, is the store's to check.
func CheckListOptions(opts stores.ListOptions) (stores.ListOptions, error) {
	if opts.State != 0 {
		if err := CheckState(opts.State); err != nil {
			return opts, err
		}
	}
	switch {
	case opts.Limit < 0 || opts.Limit > stores.MaxListLimit:
		return opts, fmt.Errorf("%w: limit must be between 1 and %d (0 for %d), got %d", stores.ErrInvalidArgument, stores.MaxListLimit, stores.DefaultListLimit, opts.Limit)
	case opts.Limit == 0:
		opts.Limit = stores.DefaultListLimit
	}
	return opts, nil
}

// CheckData checks the data of a Complete or Commit against the store's
// MaxData (c.CheckData) and, when serverLimit is positive, against a
// lower limit the store found on its server, which why names (what the
// server is configured with). Either error wraps [stores.ErrTooLarge].
func CheckData(c stores.Capabilities, data []byte, serverLimit int64, why string) error {
	if err := c.CheckData(data); err != nil {
		return err
	}
	if serverLimit > 0 && int64(len(data)) > serverLimit {
		return fmt.Errorf("%w: %d bytes of data, the server takes at most %d (%s)", stores.ErrTooLarge, len(data), serverLimit, why)
	}
	return nil
}
