package stores_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

func TestChecks(t *testing.T) {
	claimed := &stores.Claim{Scope: "s", Keys: []string{"k"}, Result: stores.Claimed, Token: "t"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want error // nil: no error
	}{
		{"keys", stores.CheckKeys([]string{"a", "b"}), nil},
		{"no keys", stores.CheckKeys(nil), stores.ErrInvalidKey},
		{"an empty key", stores.CheckKeys([]string{"a", ""}), stores.ErrInvalidKey},
		{"lease", stores.CheckLease(time.Nanosecond), nil},
		{"zero lease", stores.CheckLease(0), stores.ErrInvalidArgument},
		{"negative retention", stores.CheckRetention(-time.Second), stores.ErrInvalidArgument},
		{"claim", stores.CheckClaim(claimed), nil},
		{"nil claim", stores.CheckClaim(nil), stores.ErrInvalidArgument},
		{"duplicate result", stores.CheckClaim(&stores.Claim{Keys: []string{"k"}, Result: stores.Duplicate}), stores.ErrInvalidArgument},
		{"claim without a token", stores.CheckClaim(&stores.Claim{Keys: []string{"k"}, Result: stores.Claimed}), stores.ErrInvalidArgument},
		{"claim with an empty key", stores.CheckClaim(&stores.Claim{Keys: []string{""}, Result: stores.Claimed, Token: "t"}), stores.ErrInvalidArgument},
		{"call", stores.CheckCall(context.Background(), false, nil, nil), nil},
		{"call on a closed store", stores.CheckCall(cancelled, true, stores.CheckKeys(nil)), stores.ErrClosed},
		{"call with a bad argument", stores.CheckCall(cancelled, false, nil, stores.CheckLease(0)), stores.ErrInvalidArgument},
		{"call with its context done", stores.CheckCall(cancelled, false, nil), context.Canceled},
	} {
		switch {
		case tc.want == nil && tc.err != nil:
			t.Errorf("%s: %v", tc.name, tc.err)
		case tc.want != nil && !errors.Is(tc.err, tc.want):
			t.Errorf("%s = %v, want an error wrapping %v", tc.name, tc.err, tc.want)
		}
	}
}
