package sqlkeys_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/sqlkeys"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

type dialect struct {
	name    string
	open    func(t *testing.T) *sql.DB
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	table   func(topic string) string
}

var dialects = []dialect{
	{"postgres", func(t *testing.T) *sql.DB { return open(t, "pgx", testkit.RequirePostgres(t)) },
		wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}, func(topic string) string { return `"watermill_` + topic + `"` }},
	{"mysql", func(t *testing.T) *sql.DB { return open(t, "mysql", testkit.RequireMySQL(t)) },
		wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}, func(topic string) string { return "`watermill_" + topic + "`" }},
}

func open(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		testkit.Unavailable(t, driver, dsn, err)
	}
	return db
}

// TestForeignRows: a producer that is not Watermill inserts rows into a
// watermill-sql topic with plain SQL: one event twice under its own id in
// the uuid column (a retried INSERT), one under a fresh random id each
// time. The middleware's default key runs the first event once; Offset
// keys every row apart, by topic and offset.
func TestForeignRows(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			ctx := context.Background()
			topic := "sqlkeys_" + storetest.NewID()
			sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
				ConsumerGroup:  "g",
				SchemaAdapter:  sqlkeys.SchemaAdapter{SchemaAdapter: d.schema},
				OffsetsAdapter: d.offsets,
				PollInterval:   20 * time.Millisecond,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			// The router closes the subscriber.
			if err := sub.SubscribeInitialize(topic); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, table := range []string{d.table(topic), d.table("offsets_" + topic)} {
					if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
						t.Errorf("drop %s: %v", table, err)
					}
				}
			})

			// The foreign producer.
			insert := fmt.Sprintf("INSERT INTO %s (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())", d.table(topic))
			if d.name == "mysql" {
				insert = fmt.Sprintf("INSERT INTO %s (uuid, payload, metadata) VALUES (?, ?, ?)", d.table(topic))
			}
			keytest.ForeignRows(t, db, insert, sub, topic, sqlkeys.Offset())
		})
	}
}

func TestOffsetWithoutARow(t *testing.T) {
	msg := message.NewMessage("m-1", nil)
	if _, err := sqlkeys.Offset()(msg); !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("Offset() outside a router = %v, want ErrNoKey", err)
	}
}
