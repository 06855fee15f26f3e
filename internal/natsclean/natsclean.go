// Package natsclean deletes the JetStream KV buckets of a natsstore
// configuration, which a program or a test made for itself.
package natsclean

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// DeleteBuckets deletes the KV buckets of cfg (every shard's), and
// only those.
func DeleteBuckets(ctx context.Context, nc *nats.Conn, cfg natsstore.Config) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var errs []error
	for _, b := range cfg.Buckets() {
		if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			errs = append(errs, fmt.Errorf("delete bucket %s: %w", b, err))
		}
	}
	return errors.Join(errs...)
}
