package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// Example_admin reads a record through the admin interface, refuses to
// release it since it is done, then forgets it: the next delivery of its
// message claims it again.
func Example_admin() {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	c, err := s.Claim(ctx, "loyalty", []string{"payment:PAY-1842"}, time.Minute)
	if err != nil {
		panic(err)
	}
	if err := s.Complete(ctx, c, 24*time.Hour, nil); err != nil {
		panic(err)
	}

	var admin stores.Admin = s
	rec, err := admin.Get(ctx, "loyalty", "payment:PAY-1842")
	if err != nil {
		panic(err)
	}
	fmt.Println(rec.State, "until", time.Until(rec.ExpiresAt).Round(time.Hour))

	// memstore keeps a hash of (scope, key): records are listed by ID.
	_, _, err = admin.List(ctx, stores.ListOptions{Scope: "loyalty"})
	fmt.Println("list by scope:", errors.Is(err, stores.ErrNotSupported))
	all, _, err := admin.List(ctx, stores.ListOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("records:", len(all), all[0].ID == rec.ID)

	_, err = admin.Delete(ctx, "loyalty", "payment:PAY-1842", stores.StateProcessing)
	fmt.Println("release:", errors.Is(err, stores.ErrWrongState))
	if _, err := admin.Delete(ctx, "loyalty", "payment:PAY-1842", stores.StateDone); err != nil {
		panic(err)
	}
	again, err := s.Claim(ctx, "loyalty", []string{"payment:PAY-1842"}, time.Minute)
	if err != nil {
		panic(err)
	}
	fmt.Println("after forget:", again.Result)
	// Output:
	// done until 24h0m0s
	// list by scope: true
	// records: 1 true
	// release: true
	// after forget: claimed
}
