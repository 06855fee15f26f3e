package redisstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// TestTLS runs the conformance suite over TLS, on a redis-server of its
// own that speaks TLS only and requires a client certificate, with
// certificates of a private CA the test makes; and checks that a client
// that does not trust the CA, or has no certificate, is refused.
func TestTLS(t *testing.T) {
	addr, files := testkit.StartRedisTLS(t, true)
	newTLSClient := func(t testing.TB, withCert bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: files.ClientConfig(t, withCert), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	client := newTLSClient(t, true)
	storetest.Run(t, factory(client, redisstore.Config{}), serverTime(client))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newStore(t, client, redisstore.Config{})
	if err := s.CheckServer(ctx); err != nil {
		t.Errorf("CheckServer over TLS: %v", err)
	}
	if _, err := s.Claim(ctx, "s", []string{"k"}, time.Minute); err != nil {
		t.Fatal(err)
	}

	t.Run("refused", func(t *testing.T) {
		// A server that refuses the client's certificate (its TLS alert:
		// none given, or one of another CA) refuses a setting, as it
		// does a wrong password: not an outage, which FailOpen would run
		// handlers through, unprotected, for as long as it lasts.
		other := testkit.MakeTLSFiles(t)
		otherCert := files.ClientConfig(t, false)
		otherCert.Certificates = other.ClientConfig(t, true).Certificates
		for name, cfg := range map[string]*tls.Config{"without a certificate": files.ClientConfig(t, false), "with a certificate of another CA": otherCert} {
			c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			_, err := newStore(t, c, redisstore.Config{Prefix: s.Prefix()}).Claim(ctx, "s", []string{"k"}, time.Minute)
			if err == nil {
				t.Errorf("a client %s was let in", name)
			} else if errors.Is(err, stores.ErrUnavailable) || !errors.Is(err, redisstore.ErrRefused) || !strings.Contains(err.Error(), "remote error: tls") {
				t.Errorf("a client %s: %v, want the server's TLS alert, ErrRefused, not an outage", name, err)
			}
		}
		untrusting := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}, MaxRetries: -1})
		defer untrusting.Close()
		if err := untrusting.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a client that does not trust the CA: %v, want a certificate error", err)
		}
		plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer plain.Close()
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Error("a client without TLS was answered")
		}
	})
}
