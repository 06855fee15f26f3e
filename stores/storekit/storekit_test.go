package storekit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
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
		{"keys", storekit.CheckKeys([]string{"a", "b"}), nil},
		{"no keys", storekit.CheckKeys(nil), stores.ErrInvalidKey},
		{"an empty key", storekit.CheckKeys([]string{"a", ""}), stores.ErrInvalidKey},
		{"lease", stores.Capabilities{}.CheckLease(time.Nanosecond), nil},
		{"zero lease", stores.Capabilities{}.CheckLease(0), stores.ErrInvalidArgument},
		{"negative retention", stores.Capabilities{}.CheckRetention(-time.Second), stores.ErrInvalidArgument},
		{"claim", storekit.CheckClaim(claimed), nil},
		{"nil claim", storekit.CheckClaim(nil), stores.ErrInvalidArgument},
		{"duplicate result", storekit.CheckClaim(&stores.Claim{Keys: []string{"k"}, Result: stores.Duplicate}), stores.ErrInvalidArgument},
		{"claim without a token", storekit.CheckClaim(&stores.Claim{Keys: []string{"k"}, Result: stores.Claimed}), stores.ErrInvalidArgument},
		{"claim with an empty key", storekit.CheckClaim(&stores.Claim{Keys: []string{""}, Result: stores.Claimed, Token: "t"}), stores.ErrInvalidArgument},
		{"call", storekit.CheckCall(context.Background(), false, nil, nil), nil},
		{"call on a closed store", storekit.CheckCall(cancelled, true, storekit.CheckKeys(nil)), stores.ErrClosed},
		{"call with a bad argument", storekit.CheckCall(cancelled, false, nil, stores.Capabilities{}.CheckLease(0)), stores.ErrInvalidArgument},
		{"call with its context done", storekit.CheckCall(cancelled, false, nil), context.Canceled},
	} {
		switch {
		case tc.want == nil && tc.err != nil:
			t.Errorf("%s: %v", tc.name, tc.err)
		case tc.want != nil && !errors.Is(tc.err, tc.want):
			t.Errorf("%s = %v, want an error wrapping %v", tc.name, tc.err, tc.want)
		}
	}
}

func TestCheckData(t *testing.T) {
	c := stores.Capabilities{MaxData: 10}
	for _, tc := range []struct {
		n     int
		limit int64
		ok    bool
	}{
		{10, 0, true}, {11, 0, false}, {5, 5, true}, {6, 5, false}, {10, 20, true},
	} {
		err := storekit.CheckData(c, make([]byte, tc.n), tc.limit, "a setting")
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, stores.ErrTooLarge)) {
			t.Errorf("CheckData(%d bytes, MaxData 10, server limit %d) = %v, want ok %t", tc.n, tc.limit, err, tc.ok)
		}
	}
}
