package storeopen

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// kinds is every store kind, in the order the programs list them. This
// is where a store is registered: one line, its Kind defined in a file
// of its own in this package (memory.go, redis.go, sql.go, nats.go).
var kinds = []*Kind{memoryKind, redisKind, postgresKind, mysqlKind, sqliteKind, natsKind}

// Kind is one kind of store: its name, the service it runs on, its
// settings, and how it is opened and closed. anystore.OpenStore,
// router_example and cmd/dedupctl open every store through its Kind.
type Kind struct {
	// Name is the kind's -store value ("redis").
	Name string

	// Service is what the store runs on, as errors and summaries name it
	// ("Redis"); empty for a store that lives inside its process.
	Service string

	// Dialect is the sqlstore dialect of a SQL kind, empty for the
	// others.
	Dialect sqlstore.Dialect

	// flags defines the kind's own flags on fs, bound to s (see
	// Settings.RegisterFlags). Nil: the kind has none.
	flags func(fs *flag.FlagSet, s *Settings)

	// check validates the settings of a program that administers the
	// store (Request.Admin), before anything connects. Nil: nothing to
	// check.
	check func(s *Settings) error

	// runName is the name of router_example's run runID: its key prefix,
	// table or bucket. Nil: the kind keeps no run of its own.
	runName func(runID string) string

	// open opens the kind's connections and builds its store into out.
	// On an error it returns, Open closes what out holds.
	open func(ctx context.Context, o Opener, r Request, out *Opened) error
}

// InProcess reports whether the store lives inside its process (memory):
// there is no service to reach, and no other process sees its records.
func (k *Kind) InProcess() bool { return k.Service == "" }

// RunName is where router_example's run runID keeps its records on this
// kind (its key prefix, table or bucket), out of the store's defaults;
// "" for a kind without one.
func (k *Kind) RunName(runID string) string {
	if k.runName == nil {
		return ""
	}
	return k.runName(runID)
}

// Check validates the settings of a program that administers the store
// (Request.Admin) before anything connects: Open does too.
func (k *Kind) Check(s Settings) error {
	if k.check == nil {
		return nil
	}
	return k.check(&s)
}

// Kinds returns every store kind, in the order the programs list them.
func Kinds() []*Kind { return slices.Clone(kinds) }

// Lookup returns the kind named name.
func Lookup(name string) (*Kind, bool) {
	i := slices.IndexFunc(kinds, func(k *Kind) bool { return k.Name == name })
	if i < 0 {
		return nil, false
	}
	return kinds[i], true
}

// Names returns the names of the kinds keep selects (every kind's with a
// nil keep), in the order the programs list them.
func Names(keep func(*Kind) bool) []string {
	var out []string
	for _, k := range kinds {
		if keep == nil || keep(k) {
			out = append(out, k.Name)
		}
	}
	return out
}

// Request says what to open besides the service the settings name.
type Request struct {
	// Settings are where the service is and, with Admin, how the store
	// is configured.
	Settings Settings

	// Name is where the store keeps its records: its key prefix (Redis),
	// table (SQL) or bucket (NATS). Empty: the settings' (-redis-prefix,
	// -table, -nats-bucket, or the run's of -run-id), else the store's
	// default.
	Name string

	// Config is the store's own configuration, of its package's type
	// (memstore.Config, redisstore.Config, sqlstore.Config,
	// natsstore.Config); nil is the zero Config. Name, when set, replaces
	// its name field, and a SQL kind sets its Dialect.
	Config any

	// Admin opens the records as they are, to administer them: the store
	// is configured from the settings (an error in them is a
	// *SettingError), creates nothing, runs no batching and no purge job,
	// and refuses a place that would show part of the records only (a
	// node of a Redis Cluster opened as one server, a table or a bucket
	// that does not exist).
	Admin bool

	// CreateSchema creates the SQL table, if it does not exist.
	CreateSchema bool

	// Logger is the store's logger, for a kind whose Config has one
	// (redisstore, sqlstore) and sets none.
	Logger watermill.LoggerAdapter

	// RemoveOnClose makes Close delete what the store keeps under Name
	// (see Opened.Remove) once the store is closed, before the
	// connections are.
	RemoveOnClose bool
}

// name is where the store of kind k keeps its records: r.Name, else
// setting (-redis-prefix, -table, -nats-bucket), else the run's of
// -run-id; "" for the store's default.
func (r Request) name(k *Kind, setting string) string {
	switch {
	case r.Name != "":
		return r.Name
	case setting != "":
		return setting
	case r.Settings.RunID != "":
		return k.RunName(r.Settings.RunID)
	}
	return ""
}

// Opened is a store a Kind opened, with what is behind it.
type Opened struct {
	Store stores.Store
	Kind  *Kind

	// Service is what the store runs on ("Redis Cluster" for a Redis
	// Cluster), Addr where, for people: no password.
	Service, Addr string

	// Name is the key prefix, table or bucket the store keeps its records
	// under: the one asked for, else the store's default ("" for memory).
	Name string

	// Records says where the records are, for people: `prefix "dedup:"`,
	// "table dedup_inbox", "bucket dedup", "in-process".
	Records string

	// Removal says what Remove deletes, for people ("delete Redis keys
	// p*", "drop table t"); empty when it deletes nothing.
	Removal string

	// The connection the store runs on: DB for SQL (Path for SQLite),
	// Redis, NATS.
	DB    *sql.DB
	Path  string
	Redis redis.UniversalClient
	NATS  *nats.Conn

	// TempDir is the directory made for the store's files (SQLite without
	// a file), which Close removes; empty when there is none.
	TempDir string

	stopStore     func(context.Context) error
	closeConns    []func(context.Context) error
	remove        func(context.Context) error
	removeOnClose bool
}

// Open opens the store of the kind named kind that r describes, with o's
// pools, time-outs and setting names. When it fails, nothing stays open.
// A setting that does not parse is a *SettingError; a service that does
// not answer or refuses, an *UnreachableError naming the setting to
// change.
func (o Opener) Open(ctx context.Context, kind string, r Request) (*Opened, error) {
	k, ok := Lookup(kind)
	if !ok {
		return nil, fmt.Errorf("unknown store %q: want one of %s", kind, strings.Join(Names(nil), ", "))
	}
	if r.Admin {
		if err := k.Check(r.Settings); err != nil {
			return nil, o.renamed(err)
		}
	}
	out := &Opened{Kind: k, Service: k.Service, removeOnClose: r.RemoveOnClose}
	if err := k.open(ctx, o, r, out); err != nil {
		_ = out.Close(context.WithoutCancel(ctx))
		return nil, o.renamed(err)
	}
	return out, nil
}

// Close closes the store, then (with Request.RemoveOnClose) deletes its
// records, then closes the connections Open made and removes its
// temporary directory. It tries every step and returns what failed.
func (x *Opened) Close(ctx context.Context) error {
	var errs []error
	if x.stopStore != nil {
		errs = append(errs, x.stopStore(ctx))
		x.stopStore = nil
	}
	if x.removeOnClose {
		errs = append(errs, x.Remove(ctx))
		x.removeOnClose = false
	}
	for i := len(x.closeConns) - 1; i >= 0; i-- {
		errs = append(errs, x.closeConns[i](ctx))
	}
	x.closeConns = nil
	return errors.Join(errs...)
}

// Remove deletes what the store keeps under Name, and only that (the keys
// under its prefix, its table, its buckets; never a whole shared
// service). A store opened without a name of its own (Request.Name and
// the settings') removes nothing: its records are under the store's
// default, which other programs may share.
func (x *Opened) Remove(ctx context.Context) error {
	if x.remove == nil {
		return nil
	}
	return x.remove(ctx)
}

// Admin returns the store's stores.Admin, or an error when its kind has
// none.
func (x *Opened) Admin() (stores.Admin, error) {
	a, ok := x.Store.(stores.Admin)
	if !ok {
		return nil, fmt.Errorf("the %s store has no stores.Admin: %w", x.Kind.Name, stores.ErrNotSupported)
	}
	return a, nil
}

// setStore records s as the store, closed first by Close.
func (x *Opened) setStore(s stores.Store) {
	x.Store = s
	x.stopStore = s.Close
}

// onClose adds a connection (or a directory) for Close, closed in the
// reverse order of onClose.
func (x *Opened) onClose(f func(context.Context) error) { x.closeConns = append(x.closeConns, f) }

// configOf returns r.Config as the Config type of the kind, the zero
// Config when r has none.
func configOf[C any](k *Kind, r Request) (C, error) {
	var zero C
	if r.Config == nil {
		return zero, nil
	}
	c, ok := r.Config.(C)
	if !ok {
		return zero, fmt.Errorf("storeopen: the %s store takes a %T, not a %T", k.Name, zero, r.Config)
	}
	return c, nil
}

// renamed is err with the setting it names renamed as o.SettingNames says.
func (o Opener) renamed(err error) error {
	if len(o.SettingNames) == 0 {
		return err
	}
	var u *UnreachableError
	if errors.As(err, &u) {
		if to, ok := o.SettingNames[u.Setting]; ok {
			u.Setting = to
		}
	}
	var s *SettingError
	if errors.As(err, &s) {
		if to, ok := o.SettingNames[s.Setting]; ok {
			s.Setting = to
		}
	}
	return err
}
