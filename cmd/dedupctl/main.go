// Command dedupctl shows and changes the records of a watermill-dedup
// store: what an operator needs when a consumer misbehaves, without
// writing SQL or Lua by hand.
//
//	go run ./cmd/dedupctl -store=redis stats
//	go run ./cmd/dedupctl -store=postgres get loyalty msg:0b9e5c3a-7f0d-4c1e-9a55-1d2f3e4a5b6c
//	go install github.com/watermill-dedup/dedup/cmd/dedupctl@latest
//
// It reaches Redis (standalone, or a Redis Cluster with -redis-cluster),
// PostgreSQL, MySQL/MariaDB and SQLite with router_example's flags and
// environment variables: -store (DEDUP_STORE), -redis-addr (REDIS_ADDR),
// -postgres-dsn (POSTGRES_DSN), -mysql-dsn (MYSQL_DSN), -dir (the
// directory of the example's SQLite file), -run-id; -redis-prefix and
// -table point at the store's records, -sqlite-file at any SQLite file.
// -redis-addr also takes a URL, redis://user:password@host:port/db, or
// rediss:// for TLS with -redis-ca for a private CA (-redis-cert and
// -redis-key for a client certificate); no output shows its password.
// Without -store, the address flags of one store name it:
//
//	go run ./cmd/dedupctl -redis-addr=redis://127.0.0.1:6379/0 stats
//
// It reaches natsstore's KV buckets on NATS JetStream with -store=nats,
// -nats-url (NATS_URL, as router_example's NATS broker: credentials in
// the URL, tls:// for TLS), -nats-bucket and -nats-shards (the store's
// Bucket and Shards), -nats-user and -nats-password, -nats-token,
// -nats-creds or -nats-nkey, -nats-ca for a private CA, and -nats-cert
// with -nats-key for a client certificate.
// Every connection flag -some-name is also the environment variable
// DEDUP_SOME_NAME, but for the addresses (NATS_URL too); a flag wins over
// the environment. Flags may come before or after the command.
//
// Commands:
//
//	stats                  records by state (processing, done, expired and not yet
//	                       purged) and by scope, oldest and newest expiry, approximate size
//	get SCOPE KEY          one record: state, token, lease until, expires at,
//	                       payload fingerprint, number of stored outputs
//	get -id=ID             the record of an id list printed
//	list [SCOPE]           records; -state=processing|done, -prefix=KEY_PREFIX,
//	                       -limit=N, -after=CURSOR (the next page)
//	forget SCOPE KEY       delete a done record: its message is processed again
//	                       (unless another of its keys still has a done record)
//	release SCOPE KEY      delete a processing record: frees a stuck claim
//	forget|release -id=ID  the same, for the record of an id list printed
//	purge                  delete expired records now
//	window                 a calculator: the retention to configure for a redelivery
//	                       horizon (-horizon), and with -rate the storage it needs on
//	                       every store (or on -store, or at -bytes-per-record)
//
// forget and release change nothing without -yes: they show what they
// would delete. Instead of KEY they take -prefix=KEY_PREFIX (or, with
// -all alone, every record of the scope) and then refuse to delete more
// than one record without -all. They print every record they deleted.
//
// A record is found by its scope and key on every store, but sqlstore
// keeps each record under a digest of (scope, key) (sqlstore.RecordID),
// and so do natsstore (its KV key) and redisstore with -compact-keys:
// there list, forget and release cannot select a scope or key prefix,
// and stats does not count by scope. get SCOPE KEY still reads any
// record, list without SCOPE lists every record by id, and get, forget
// and release take such an id as -id=ID (with the same dry run, -yes and
// state check). Redis's
// default layout keeps scopes and keys (but for keys stored as digests,
// -digest-keys-longer-than). Every key under the prefix is read as the
// store with that prefix reads it: a key that is not one of its records
// is passed over, and stats counts it. router_example keeps a run's
// records under names of its own, "router_example:<run id>:", the
// table router_example_<run id> and the NATS bucket of that name, which
// -run-id reads. Scopes and keys
// are printed quoted and escaped to ASCII.
//
// Output is a table for people; -json writes JSON for scripts. The exit
// status is:
//
//	0  done
//	1  the store failed, or could not be reached
//	2  bad usage: an unknown command, store or flag, a bad argument, or a
//	   request the store's layout cannot serve
//	3  not found: no record for SCOPE KEY, or none matching -prefix
//	4  refused, nothing deleted: forget or release without -yes, several
//	   records without -all, or a record in the other state
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/watermill-dedup/dedup/internal/cliflag"
	"github.com/watermill-dedup/dedup/internal/storeopen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// go-redis's own lines (a failed dial) repeat the error dedupctl
	// prints: they are dropped, not printed raw beside it.
	storeopen.SetRedisLogger(nil)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, cmd, pos, err := parseArgs(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	c := &cli{cfg: &cfg, out: stdout}
	if err := c.exec(ctx, cmd, pos); err != nil {
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitCode(err)
	}
	return exitOK
}

// The usage text, around the flags printFlags lists.
var (
	//go:embed usage.txt
	usageText string
	//go:embed usage_exit.txt
	usageExitText string
)

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageText)
	printFlags(w, func(name string) bool { return isConnectionFlag(name) })
	fmt.Fprint(w, "\nOutput and commands:\n")
	printFlags(w, func(name string) bool { return !isConnectionFlag(name) })
	fmt.Fprint(w, "\n"+usageExitText)
}

// printFlags prints the usage of the flags that selected picks.
func printFlags(w io.Writer, selected func(name string) bool) {
	var cfg config
	sub := flag.NewFlagSet("dedupctl", flag.ContinueOnError)
	sub.SetOutput(w)
	newFlagSet(&cfg).VisitAll(func(f *flag.Flag) {
		if !selected(f.Name) {
			return
		}
		usage := f.Usage
		if isConnectionFlag(f.Name) {
			usage += " [env " + cliflag.EnvName(f.Name) + "]"
		}
		sub.Var(f.Value, f.Name, usage)
	})
	sub.PrintDefaults()
}
