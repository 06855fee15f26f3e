package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// -store=nats: natsstore's buckets on NATS JetStream, opened as they are
// (natsstore.Open: no bucket created, none refused for its MaxAge).

// natsConfig is where natsstore's records are, and how to reach them.
type natsConfig struct {
	url    string
	bucket string
	shards int
	auth   storeopen.NATSAuth
}

func (n *natsConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&n.url, "nats-url", defaultNATSURL, "NATS `URL` (comma-separated: servers of one cluster); nats://user:password@host:port or nats://token@host:port carry credentials, tls:// asks for TLS")
	fs.StringVar(&n.bucket, "nats-bucket", natsstore.DefaultBucket, "the store's KV bucket, Config.Bucket")
	fs.IntVar(&n.shards, "nats-shards", 0, "the store's Config.Shards: its records are in the buckets <bucket>-0 ... <bucket>-<n-1>")
	n.auth.RegisterFlags(fs)
}

func openNATS(ctx context.Context, c *config) (*admin, error) {
	cfg := natsstore.Config{Bucket: c.nats.bucket, Shards: c.nats.shards, MaxLease: c.purgeGrace}
	if err := cfg.Validate(); err != nil {
		return nil, usagef("-nats-bucket, -nats-shards, -purge-grace: %v", err)
	}
	nc, err := connect.NATS(ctx, c.nats.url, c.nats.auth, nats.Name("dedupctl"), nats.MaxReconnects(0))
	if err != nil {
		return nil, err
	}
	addr := storeopen.RedactNATSURL(c.nats.url)
	buckets := cfg.Buckets()
	where := fmt.Sprintf("NATS %s, bucket %s", addr, buckets[0])
	if len(buckets) > 1 {
		where = fmt.Sprintf("NATS %s, buckets %s", addr, strings.Join(buckets, ", "))
	}
	s, err := natsstore.Open(ctx, nc, cfg)
	if err != nil {
		nc.Close()
		if errors.Is(err, natsstore.ErrNoBucket) {
			return nil, fmt.Errorf("%v on NATS %s (change -nats-bucket, or -nats-shards: a store of n shards keeps its records in <bucket>-0 ... <bucket>-<n-1>)", err, addr)
		}
		return nil, fmt.Errorf("cannot open %s: %w", where, err)
	}
	return &admin{
		Admin: s,
		where: where,
		close: func(ctx context.Context) error {
			err := s.Close(ctx)
			nc.Close()
			return err
		},
	}, nil
}
