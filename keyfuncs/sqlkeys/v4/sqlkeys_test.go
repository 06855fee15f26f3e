package sqlkeys_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-dedup/dedup/internal/testkit/keytest"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	sqlkeys "github.com/watermill-dedup/dedup/keyfuncs/sqlkeys/v4"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// adapters are v4's schema adapters, each with its offsets adapter, the
// consumer group it takes and the INSERT another producer runs.
var adapters = []struct {
	name    string
	mysql   bool
	pgx     bool // the subscriber on pgx itself (BeginnerFromPgx)
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	group   string
	insert  string // %s: the quoted table
}{
	{"postgres", false, false, wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}, "g",
		"INSERT INTO %s (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())"},
	{"postgres-pgx", false, true, wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}, "g",
		"INSERT INTO %s (uuid, payload, metadata, transaction_id) VALUES ($1, $2, $3, pg_current_xact_id())"},
	{"postgres-queue", false, false, wsql.PostgreSQLQueueSchema{}, wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true}, "",
		"INSERT INTO %s (uuid, payload, metadata) VALUES ($1, $2, $3)"},
	{"mysql", true, false, wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}, "g",
		"INSERT INTO %s (uuid, payload, metadata) VALUES (?, ?, ?)"},
	{"mysql-queue", true, false, wsql.MySQLQueueSchema{}, wsql.MySQLQueueOffsetsAdapter{}, "",
		"INSERT INTO %s (uuid, payload, metadata) VALUES (?, ?, ?)"},
}

// tabled is what v4's adapters offer beyond the SchemaAdapter and
// OffsetsAdapter interfaces: their table names, quoted.
type tabled interface{ MessagesTable(topic string) string }

// TestForeignRows: a producer that is not Watermill inserts rows into a
// watermill-sql v4 topic with plain SQL, on each of v4's schema adapters:
// one event twice under its own id in the uuid column (a retried
// INSERT), one under a fresh id. The middleware's default key runs the
// first event once; Offset keys every row apart, by topic and offset.
func TestForeignRows(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			db, beginner := openDB(t, a.mysql, a.pgx)
			topic := "sqlkeys4_" + storetest.NewID()
			table := a.schema.(tabled).MessagesTable(topic)
			sub, err := wsql.NewSubscriber(beginner, wsql.SubscriberConfig{
				ConsumerGroup:  a.group,
				SchemaAdapter:  sqlkeys.SchemaAdapter{SchemaAdapter: a.schema},
				OffsetsAdapter: a.offsets,
				PollInterval:   20 * time.Millisecond,
			}, watermill.NopLogger{})
			tables := []string{table}
			if o, ok := a.offsets.(interface{ MessagesOffsetsTable(string) string }); ok {
				tables = append(tables, o.MessagesOffsetsTable(topic))
			}
			sqltest.InitializeTopic(t, db, a.mysql, sub, err, topic, tables...)
			keytest.ForeignRows(t, db, fmt.Sprintf(a.insert, table), sub, topic, sqlkeys.Offset())
		})
	}
}

// openDB opens the test database: a *sql.DB for the producer and the
// cleanup, and the subscriber's Beginner on it, or on a pgx pool of its
// own.
func openDB(t *testing.T, mysql, pgx bool) (*sql.DB, wsql.Beginner) {
	t.Helper()
	db, dsn := sqltest.OpenSQL(t, mysql)
	if !pgx {
		return db, wsql.BeginnerFromStdSQL(db)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return db, wsql.BeginnerFromPgx(pool)
}

// TestSchemaAdapterKeepsRequiresTransaction: watermill-sql v4 creates a
// topic's tables in a transaction, under an advisory lock, when its
// schema adapter implements wsql.RequiresTransaction and says so
// (DefaultPostgreSQLSchema does: concurrent CREATE TABLE IF NOT EXISTS
// can fail on PostgreSQL). The wrapper must say what the adapter it wraps
// says, or wrapping would turn that off.
func TestSchemaAdapterKeepsRequiresTransaction(t *testing.T) {
	for _, c := range []struct {
		inner wsql.SchemaAdapter
		want  bool
	}{
		{wsql.DefaultPostgreSQLSchema{}, true},
		{wsql.DefaultPostgreSQLSchema{InitializeSchemaWithoutTransaction: true}, false},
		{wsql.DefaultMySQLSchema{}, false},
		{wsql.PostgreSQLQueueSchema{}, false},
	} {
		var a wsql.SchemaAdapter = sqlkeys.SchemaAdapter{SchemaAdapter: c.inner}
		rt, ok := a.(wsql.RequiresTransaction)
		if got := ok && rt.RequiresTransaction(); got != c.want {
			t.Errorf("sqlkeys.SchemaAdapter{%T}: requires a transaction = %v, want %v (as the adapter it wraps)", c.inner, got, c.want)
		}
	}
}

func TestOffsetWithoutARow(t *testing.T) { keytest.OffsetWithoutARow(t, sqlkeys.Offset()) }

// TestQueueSchemaAcksTheWholeBatch backs the package doc's advice on the
// queue schemas: watermill-sql v4.1.2's queue offsets adapters ack every
// row the subscriber read in a batch (AckMessageQueryParams.Rows), also
// those it never delivered or that were not acked, when the batch is cut
// short (the subscriber closing, an AckDeadline passing): they are lost,
// and no dedup key can bring them back. With SubscribeBatchSize 1 a batch
// is one row, acked only when its message was. If this test fails on the
// large batch, watermill-sql fixed it: update the doc.
func TestQueueSchemaAcksTheWholeBatch(t *testing.T) {
	for _, c := range []struct {
		batch, wantLeft int
	}{
		{batch: 10, wantLeft: 0}, // the four rows after the acked one are lost
		{batch: 1, wantLeft: 4},
	} {
		t.Run(fmt.Sprintf("batch-%d", c.batch), func(t *testing.T) {
			ctx := context.Background()
			db, beginner := openDB(t, false, false)
			topic := "sqlkeys4_" + storetest.NewID()
			schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: c.batch}
			sub, err := wsql.NewSubscriber(beginner, wsql.SubscriberConfig{
				SchemaAdapter:  sqlkeys.SchemaAdapter{SchemaAdapter: schema},
				OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
				PollInterval:   20 * time.Millisecond,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			if err := sub.SubscribeInitialize(topic); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sqltest.DropTables(context.Background(), db, sqlstore.Postgres, schema.MessagesTable(topic)); err != nil {
					t.Error(err)
				}
			})
			for i := range 5 {
				if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (uuid, payload) VALUES ($1, '{}')", schema.MessagesTable(topic)), fmt.Sprint("event-", i)); err != nil {
					t.Fatal(err)
				}
			}
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			(<-msgs).Ack()
			<-msgs // delivered, never acked
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			var left int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+schema.MessagesTable(topic)+" WHERE NOT acked").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != c.wantLeft {
				t.Errorf("SubscribeBatchSize %d: %d rows left unacked after one ack and a close, want %d", c.batch, left, c.wantLeft)
			}
		})
	}
}
