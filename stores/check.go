package stores

import (
	"context"
	"fmt"
	"time"
)

// Argument checks for store implementers. Each returns nil or an error
// wrapping [ErrInvalidKey] or [ErrInvalidArgument] that says what was
// wrong; a store calls them before any I/O and wraps their error with its
// own prefix ("memstore: claim: ..."). Bounds of a store's own (a longest
// key, a longest lease) it checks itself, after these.

// CheckCall returns the first reason a call must fail before any I/O,
// in the order of the contract's error classes: the store is closed
// ([ErrClosed]), an argument check failed (args, the results of the
// checks below and of the store's own, in the order the call takes its
// arguments), or ctx is done. A store calls it first in every method:
//
//	if err := stores.CheckCall(ctx, s.closed.Load(), stores.CheckKeys(keys), stores.CheckLease(lease)); err != nil {
//		return nil, fmt.Errorf("mystore: claim: %w", err)
//	}
func CheckCall(ctx context.Context, closed bool, args ...error) error {
	if closed {
		return ErrClosed
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
		return fmt.Errorf("%w: no keys", ErrInvalidKey)
	}
	for i, k := range keys {
		if k == "" {
			return fmt.Errorf("%w: key %d is empty", ErrInvalidKey, i)
		}
	}
	return nil
}

// CheckLease checks the lease of a Claim or Extend: positive.
func CheckLease(lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: lease must be positive, got %s", ErrInvalidArgument, lease)
	}
	return nil
}

// CheckRetention checks the retention of a Complete or Begin: positive.
func CheckRetention(retention time.Duration) error {
	if retention <= 0 {
		return fmt.Errorf("%w: retention must be positive, got %s", ErrInvalidArgument, retention)
	}
	return nil
}

// CheckClaim checks the claim handed to Complete, Release or Extend: a
// Claimed result with a token and keys. Whether the token is one the
// store hands out is the store's to check.
func CheckClaim(c *Claim) error {
	if c == nil || c.Result != Claimed || c.Token == "" || len(c.Keys) == 0 {
		return fmt.Errorf("%w: not a Claimed claim", ErrInvalidArgument)
	}
	if err := CheckKeys(c.Keys); err != nil {
		return fmt.Errorf("%w: the claim's keys are invalid: %w", ErrInvalidArgument, err)
	}
	return nil
}

// CheckRecordKey checks the key of a Get or Delete: not empty.
func CheckRecordKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	}
	return nil
}

// CheckState checks the state of a Delete: StateProcessing or StateDone.
func CheckState(want RecordState) error {
	if want != StateProcessing && want != StateDone {
		return fmt.Errorf("%w: state must be processing or done, got %s", ErrInvalidArgument, want)
	}
	return nil
}

// CheckListOptions checks the options of a List and returns them with
// the default Limit filled in. Whether the layout can filter on Scope and
// KeyPrefix, and what a cursor holds, is the store's to check.
func CheckListOptions(opts ListOptions) (ListOptions, error) {
	if opts.State != 0 {
		if err := CheckState(opts.State); err != nil {
			return opts, err
		}
	}
	switch {
	case opts.Limit < 0 || opts.Limit > MaxListLimit:
		return opts, fmt.Errorf("%w: limit must be between 1 and %d (0 for %d), got %d", ErrInvalidArgument, MaxListLimit, DefaultListLimit, opts.Limit)
	case opts.Limit == 0:
		opts.Limit = DefaultListLimit
	}
	return opts, nil
}
