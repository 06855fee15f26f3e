package sqltest

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The suites the store runs on every dialect: stores/sqlstore runs them
// on the servers, internal/onstores/sqlstore on SQLite.

// Servers are the backends behind a network connection: PostgreSQL and
// MySQL/MariaDB.
var Servers = []Backend{
	{Dialect: sqlstore.Postgres, Open: OpenPostgres},
	{Dialect: sqlstore.MySQL, Open: OpenMySQL},
}

// Conformance runs the storetest suite on each of bs with group commit
// on (the default) and off.
func Conformance(t *testing.T, bs []Backend) {
	forEachBatching(t, bs, func(t *testing.T, b Backend, off bool) {
		storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
			return NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{Clock: clock, Batch: sqlstore.BatchConfig{Disabled: off}})
		}, storetest.AdminNoScopes())
	})
}

// InboxConformance runs the Inbox conformance suite on each of bs (see
// NewInboxFixture for how each dialect ends a caller's transaction).
func InboxConformance(t *testing.T, bs []Backend) {
	ForEachBackend(t, bs, func(t *testing.T, b Backend) {
		storetest.RunInbox(t, func(t *testing.T, clock stores.Clock) storetest.InboxFixture {
			return NewInboxFixture(t, b.Open(t), b.Dialect, sqlstore.Config{Clock: clock})
		})
	})
}

// Model checks the store against the model of the Store contract on each
// of bs, with group commit on (the default) and off. Time is the fake
// clock's, truncated to the microsecond; Purge runs between calls.
func Model(t *testing.T, bs []Backend) {
	forEachBatching(t, bs, func(t *testing.T, b Backend, off bool) {
		storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
			return NewStore(t, b.Open(t), b.Dialect, sqlstore.Config{
				Clock:      clock,
				Batch:      sqlstore.BatchConfig{Disabled: off},
				PurgeGrace: ModelPurgeGrace,
			})
		}, storetest.Precision(time.Microsecond), storetest.Maintenance(PurgeStore))
	})
}

// ModelPurgeGrace is the PurgeGrace of the stores the model checks:
// longer than any finite lease the model gives but its few hour-long
// ones, so that Purge, run between calls, may forget an expired claim
// only when the contract lets it.
const ModelPurgeGrace = 24 * time.Hour

// PurgeStore is the store's housekeeping for the model.
func PurgeStore(ctx context.Context, s stores.Store) error {
	_, err := s.(*sqlstore.Store).Purge(ctx)
	return err
}
