package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/errtest"
	"github.com/watermill-dedup/dedup/stores/natsstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// The permissions the store needs, as the README lists them, tested on
// a server of the test's own whose users have exactly those.

// storeSubjects are what a store on bucket publishes to: the stream's
// info (New), its keys (writes), direct gets of a key's last revision
// (reads of a single-replica bucket) and the leader's message get
// (reads of a replicated one).
func storeSubjects(bucket string) []string {
	return []string{
		"$JS.API.STREAM.INFO.KV_" + bucket,
		"$KV." + bucket + ".>",
		"$JS.API.DIRECT.GET.KV_" + bucket + ".>",
		"$JS.API.STREAM.MSG.GET.KV_" + bucket,
	}
}

// createSubjects are what New needs besides to create a missing bucket:
// the account's JetStream info (nats.go's CreateKeyValue asks for it)
// and the stream's creation.
func createSubjects(bucket string) []string {
	return []string{"$JS.API.INFO", "$JS.API.STREAM.CREATE.KV_" + bucket}
}

// adminSubjects are what List, Stats and Purge need besides: their
// scans' consumers.
func adminSubjects(bucket string) []string {
	return []string{
		"$JS.API.CONSUMER.CREATE.KV_" + bucket + ".>",
		"$JS.API.CONSUMER.MSG.NEXT.KV_" + bucket + ".*",
		"$JS.API.CONSUMER.DELETE.KV_" + bucket + ".*",
	}
}

// natsUser is a user entry of a nats-server config allowed to publish
// to pub and to subscribe to the replies, _INBOX.>.
func natsUser(name string, pub ...[]string) string {
	var all []string
	for _, p := range pub {
		for _, s := range p {
			all = append(all, fmt.Sprintf("%q", s))
		}
	}
	return fmt.Sprintf("{user: %s, password: %s-pw, permissions: {publish: {allow: [%s]}, subscribe: {allow: [\"_INBOX.>\"]}}}", name, name, strings.Join(all, ", "))
}

// storeOnly hides a store's admin interface: the suite then checks only
// the message path.
type storeOnly struct{ stores.Store }

func (s storeOnly) Capabilities() stores.Capabilities {
	c := s.Store.Capabilities()
	c.Admin = false
	return c
}

// ClaimOwned keeps the owners' tests on the message path.
func (s storeOnly) ClaimOwned(ctx context.Context, scope string, keys []string, lease time.Duration, owner []byte) (*stores.Claim, error) {
	return s.Store.(stores.OwnerClaimer).ClaimOwned(ctx, scope, keys, lease, owner)
}

// TestLeastPrivilege: a user allowed exactly the store's subjects runs
// the conformance suite's message path (the admin calls fail, denied,
// never as an outage); one allowed the admin subjects too runs all of
// it; one allowed the create subject too creates the bucket; and a user
// without the permission to write the bucket's keys gets an error that
// says so, not an outage a fail-open consumer would run through.
func TestLeastPrivilege(t *testing.T) {
	onBinaries(t, func(t *testing.T, bin natstest.NATSBin) {
		const bucket, created, sharded = "perm", "permnew", "permsh"
		var shardSubjects [][]string
		for _, b := range (natsstore.Config{Bucket: sharded, Shards: 2}).Buckets() {
			shardSubjects = append(shardSubjects, storeSubjects(b))
		}
		// ctl's buckets: one for each store the suite opens (its admin tests
		// count what a bucket holds), each created by root.
		var ctlBuckets []string
		var ctlSubjects [][]string
		for i := range 64 {
			b := fmt.Sprint("ctl", i)
			ctlBuckets = append(ctlBuckets, b)
			ctlSubjects = append(ctlSubjects, storeSubjects(b), adminSubjects(b))
		}
		conf := "authorization {\n  users = [\n    {user: root, password: root-pw}\n" +
			"    " + natsUser("store", storeSubjects(bucket)) + "\n" +
			"    " + natsUser("ctl", append(ctlSubjects, storeSubjects(bucket), adminSubjects(bucket))...) + "\n" +
			"    " + natsUser("creator", storeSubjects(created), createSubjects(created)) + "\n" +
			"    " + natsUser("shards", shardSubjects...) + "\n" +
			"    " + natsUser("nokv", storeSubjects(bucket)[:1], storeSubjects(bucket)[2:]) + "\n" +
			"  ]\n}\n"
		addr := bin.Start(t, conf, nats.UserInfo("root", "root-pw")).Addr()
		as := func(user string) *nats.Conn {
			// Quiet: nats.go would print each permissions violation.
			return connect(t, "nats://"+addr, nats.UserInfo(user, user+"-pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		}
		root := as("root")
		ctx := context.Background()
		suiteCfg := natsstore.Config{Bucket: bucket, MaxLease: suiteMax, MaxRetention: suiteMax}
		newStore(t, root, suiteCfg) // creates the bucket the users share
		for _, b := range (natsstore.Config{Bucket: sharded, Shards: 2}).Buckets() {
			newStore(t, root, natsstore.Config{Bucket: b})
		}

		t.Run("store", func(t *testing.T) {
			nc := as("store")
			storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
				c := suiteCfg
				c.Clock = clock
				return storeOnly{openStore(t, nc, c)}
			}, storetest.AdminNoScopes())
			s := openStore(t, nc, natsstore.Config{Bucket: bucket, MaxLease: suiteMax, MaxRetention: suiteMax})
			s.SetLeaderReads(true)
			c := claim(t, s, "leader", time.Minute, "a", "b")
			if c.Result != stores.Claimed {
				t.Fatalf("Claim with leader reads = %s", c.Result)
			}
			if err := s.Complete(ctx, c, time.Hour, []byte("x")); err != nil {
				t.Fatalf("Complete with leader reads: %v", err)
			}
			if r, err := s.Get(ctx, "leader", "a"); err != nil || r.State != stores.StateDone {
				t.Fatalf("Get with the store's permissions = %+v, %v", r, err)
			}
			lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, _, err := s.List(lctx, stores.ListOptions{})
			mustBeDenied(t, "List without the admin subjects", err)
		})

		t.Run("ctl", func(t *testing.T) {
			nc := as("ctl")
			next := 0
			storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
				if next == len(ctlBuckets) {
					t.Fatalf("the suite opened more than %d stores", next)
				}
				c := suiteCfg
				c.Bucket, c.Clock = ctlBuckets[next], clock
				next++
				newStore(t, root, natsstore.Config{Bucket: c.Bucket, MaxLease: suiteMax, MaxRetention: suiteMax}).Close(ctx)
				return openStore(t, nc, c)
			}, storetest.AdminNoScopes())
			a, err := natsstore.Open(ctx, nc, natsstore.Config{Bucket: bucket})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			if _, err := a.Purge(ctx); err != nil {
				t.Fatalf("Purge with the admin permissions: %v", err)
			}
		})

		t.Run("creator", func(t *testing.T) {
			s := openStore(t, as("creator"), natsstore.Config{Bucket: created})
			if c := claim(t, s, "s", time.Minute, "k"); c.Result != stores.Claimed {
				t.Fatalf("Claim in the bucket the user created = %s", c.Result)
			}
			// The store's own subjects do not let it create a bucket.
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := natsstore.New(sctx, as("store"), natsstore.Config{Bucket: "permother"})
			mustBeDenied(t, "New of a bucket the user may not create", err)
		})

		t.Run("shards", func(t *testing.T) {
			s := openStore(t, as("shards"), natsstore.Config{Bucket: sharded, Shards: 2})
			c := claim(t, s, "s", time.Minute, "a", "b", "c", "d")
			if err := s.Complete(ctx, c, time.Hour, nil); err != nil {
				t.Fatalf("Complete over two buckets: %v", err)
			}
		})

		t.Run("denied", func(t *testing.T) {
			s := openStore(t, as("nokv"), natsstore.Config{Bucket: bucket, MaxLease: suiteMax, MaxRetention: suiteMax})
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := s.Claim(cctx, "s", []string{"denied"}, time.Minute)
			mustBeDenied(t, "Claim without the permission to write the keys", err)
		})
	})
}

// mustBeDenied checks an error of a call the server denied a subject:
// not an outage, and saying so.
func mustBeDenied(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || errors.Is(err, stores.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		t.Fatalf("%s: err = %v, want an unclassified error naming the permissions violation", what, err)
	}
	errtest.NotOutage(t, what, err, err)
}
