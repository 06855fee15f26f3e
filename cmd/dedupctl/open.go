package main

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores"
)

// admin is the store dedupctl works on.
type admin struct {
	stores.Admin
	// where says where the records are, for people: the service, its
	// address (no password) and the prefix, table or buckets.
	where string
	close func(context.Context) error
}

// connect opens the connections: a pool of two is enough for one command
// at a time; a NATS connection that drops is not reconnected.
var connect = storeopen.Opener{
	MaxConns:    2,
	SQLiteConns: 2,
	NATSOptions: []nats.Option{nats.Name("dedupctl"), nats.MaxReconnects(0)},
}

// openStore opens the store the configuration names, its records as they
// are (storeopen.Request.Admin).
func openStore(ctx context.Context, c *config) (*admin, error) {
	o, err := connect.Open(ctx, c.store, storeopen.Request{Settings: c.storeSettings(), Admin: true})
	if err != nil {
		return nil, err
	}
	a, err := o.Admin()
	if err != nil {
		_ = o.Close(ctx)
		return nil, err
	}
	return &admin{Admin: a, where: fmt.Sprintf("%s %s, %s", o.Service, o.Addr, o.Records), close: o.Close}, nil
}
