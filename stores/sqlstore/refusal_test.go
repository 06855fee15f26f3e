//go:build linux

package sqlstore_test

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/sqltest"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// pgRefusalServer is a PostgreSQL cluster of the test's own that takes
// TLS only: "dedup-client" by its client certificate (cert: verify-full),
// pwuser by password, the other roles as they are, and a table of the
// store's that both may use.
func pgRefusalServer(t *testing.T, conf string) (*sqltest.PostgresServer, string) {
	t.Helper()
	srv := sqltest.StartPostgres(t, `hostssl all "dedup-client" 127.0.0.1/32 cert
hostssl all pwuser 127.0.0.1/32 scram-sha-256
hostssl all all 127.0.0.1/32 trust`, conf)
	srv.Exec("postgres", "CREATE DATABASE test")
	srv.Exec("test",
		`CREATE ROLE "dedup-client" LOGIN`, "CREATE ROLE pwuser LOGIN PASSWORD 'pw'",
		"CREATE ROLE noconnect LOGIN", "CREATE ROLE noprivs LOGIN",
		"REVOKE CONNECT ON DATABASE test FROM PUBLIC",
		`GRANT CONNECT ON DATABASE test TO "dedup-client", pwuser, noprivs`)
	table := "dedup_test_" + storetest.NewID()
	sqltest.NewStore(t, srv.Admin("test"), sqlstore.Postgres, sqlstore.Config{Table: table})
	srv.Exec("test", `GRANT `+sqltest.StoreGrants+` ON "`+table+`" TO "dedup-client", pwuser`)
	return srv, table
}

// TestPostgresRefusalIsNotAnOutage: on a cluster of the test's own that
// takes TLS only, with client certificates for one role: every refusal of
// the client fails the claim unclassified (the handler of a fail-open
// consumer does not run), and a server that is down is still an outage.
func TestPostgresRefusalIsNotAnOutage(t *testing.T) {
	srv, table := pgRefusalServer(t, "ssl_min_protocol_version = 'TLSv1.3'")
	other := testkit.MakeTLSFiles(t) // another authority, trusted by neither side
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	withCert := func(files *testkit.TLSFiles, kv ...string) url.Values {
		v := q(append([]string{"sslmode", "verify-full", "sslrootcert", srv.CA, "sslcert", files.ClientCert, "sslkey", files.ClientKey}, kv...)...)
		return v
	}

	// The certificate the server's authority signed lets the role in.
	good := sqltest.StoreOnDB(t, sqltest.OpenDB(t, "pgx", srv.DSN("dedup-client", "", "test", withCert(srv.TLS))), sqlstore.Postgres, table)
	if c, err := good.Claim(context.Background(), "s", []string{"good"}, time.Minute); err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim with the client certificate = %+v, %v", c, err)
	}

	for _, c := range []struct {
		name, user, password string
		params               url.Values
		want                 string
	}{
		{"without a client certificate", "dedup-client", "", q("sslmode", "verify-full", "sslrootcert", srv.CA), "connection requires a valid client certificate (SQLSTATE 28000)"},
		{"with a certificate of another authority", "dedup-client", "", withCert(other), ""}, // the alert, or the reset that overtakes it
		{"in plain text on a TLS-only server", "dedup-client", "", q("sslmode", "disable"), "no pg_hba.conf entry"},
		{"with a wrong password", "pwuser", "wrong", q("sslmode", "require"), "(SQLSTATE 28P01)"},
		{"without the CONNECT privilege", "noconnect", "", q("sslmode", "require"), "permission denied for database"},
		{"without privileges on the table", "noprivs", "", q("sslmode", "require"), "(SQLSTATE 42501)"},
		{"not trusting the server's certificate", "dedup-client", "", withCert(srv.TLS, "sslrootcert", other.CA), "x509: certificate signed by unknown authority"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sqltest.StoreOnDB(t, sqltest.OpenDB(t, "pgx", srv.DSN(c.user, c.password, "test", c.params)), sqlstore.Postgres, table)
			testkit.RefusedCalls(t, s, 3, c.want, false)
		})
	}

	t.Run("TLS 1.2 on a TLS 1.3 server", func(t *testing.T) {
		// The server's alert (protocol version): crypto/tls returns it as
		// a *net.OpError, a net.Error, inside pgx's connect error.
		cfg, err := pgx.ParseConfig(srv.DSN("dedup-client", "", "test", withCert(srv.TLS)))
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLSConfig.MaxVersion = tls.VersionTLS12
		db := stdlib.OpenDB(*cfg)
		t.Cleanup(func() { _ = db.Close() })
		testkit.RefusedCalls(t, sqltest.StoreOnDB(t, db, sqlstore.Postgres, table), 3, "remote error: tls: protocol version not supported", false)
	})

	t.Run("FailOpen runs no handler", func(t *testing.T) {
		s := sqltest.StoreOnDB(t, sqltest.OpenDB(t, "pgx", srv.DSN("pwuser", "wrong", "test", q("sslmode", "require"))), sqlstore.Postgres, table)
		if ran, err := testkit.FailOpenRun(t, s, 5); ran != 0 || err == nil {
			t.Fatalf("FailOpen with a wrong password: %d of 5 handlers ran unprotected, last error %v", ran, err)
		}
	})

	// pgVia opens the cluster as user through r, with password, over
	// TLS.
	pgVia := func(t *testing.T, r *redirect, user, password string) *sqlstore.Store {
		cfg, err := pgx.ParseConfig(srv.DSN(user, password, "test", q("sslmode", "require", "connect_timeout", "10")))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = r.dial
		db := stdlib.OpenDB(*cfg)
		db.SetMaxIdleConns(0) // every call on a connection of its own, from r
		return sqltest.StoreOnDB(t, db, sqlstore.Postgres, table)
	}
	t.Run("a reset after the refusal", func(t *testing.T) {
		resetsAfterRefusal(t, srv.Addr(), "(SQLSTATE 28P01)", func(r *redirect) *sqlstore.Store { return pgVia(t, r, "pwuser", "wrong") })
	})
	t.Run("outages stay outages", func(t *testing.T) {
		outagesStay(t, srv.Addr(), func(r *redirect) *sqlstore.Store { return pgVia(t, r, "pwuser", "pw") })
	})
}

// TestPostgresWithoutTLSIsNotAnOutage: a client that requires TLS
// (sslmode=require) on a server without it is refused ("server refused
// TLS connection"), not an outage.
func TestPostgresWithoutTLSIsNotAnOutage(t *testing.T) {
	srv := sqltest.StartPostgres(t, "host all all 127.0.0.1/32 trust", "ssl = off")
	srv.Exec("postgres", "CREATE DATABASE test")
	table := "dedup_test_" + storetest.NewID()
	sqltest.NewStore(t, srv.Admin("test"), sqlstore.Postgres, sqlstore.Config{Table: table})
	s := sqltest.StoreOnDB(t, sqltest.OpenDB(t, "pgx", srv.DSN("postgres", "", "test", url.Values{"sslmode": {"require"}})), sqlstore.Postgres, table)
	testkit.RefusedCalls(t, s, 3, "server refused TLS connection", false)
	if ran, err := testkit.FailOpenRun(t, s, 3); ran != 0 || err == nil {
		t.Fatalf("FailOpen with TLS required of a server without it: %d of 3 handlers ran unprotected, last error %v", ran, err)
	}
}

// redirect is a dialer whose target the test switches: the server, a
// port that closes every connection it accepts, one where nothing
// listens.
type redirect struct{ target atomic.Pointer[string] }

func newRedirect(target string) *redirect {
	r := &redirect{}
	r.to(target)
	return r
}

func (r *redirect) to(target string) { r.target.Store(&target) }

func (r *redirect) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", *r.target.Load())
}

// resetsAfterRefusal: a server that refused the client (its error holds
// want) is not unavailable when it closes the next connections while they
// are set up, with a reset or an EOF; neither is one that never answered
// the store. Nothing listening is an outage, refusal or not.
func resetsAfterRefusal(t *testing.T, server, want string, open func(*redirect) *sqlstore.Store) {
	r := newRedirect(server)
	s := open(r)
	testkit.RefusedCalls(t, s, 1, want, false)
	for _, reset := range []bool{true, false} {
		r.to(testkit.Closing(t, reset))
		testkit.RefusedCalls(t, s, 3, "not known to be an outage", false)
	}
	testkit.RefusedCalls(t, open(newRedirect(testkit.Closing(t, true))), 3, "not known to be an outage", false)
	r.to(testkit.ClosedAddr(t))
	outage(t, "nothing listening, after a refusal", s)
}

// outage makes 3 Claims on s and checks each fails with an outage.
func outage(t *testing.T, what string, s *sqlstore.Store) {
	t.Helper()
	for i := range 3 {
		_, err := s.Claim(context.Background(), "s", []string{"down" + strconv.Itoa(i)}, time.Minute)
		if !errors.Is(err, stores.ErrUnavailable) {
			t.Fatalf("Claim %d, %s: %v, want an outage", i, what, err)
		}
	}
}

// outagesStay: a store the server answered meets an outage when nothing
// listens any more; a store that never reached the server, too. A server
// that accepts the connection and closes it while it is set up (a reset,
// an EOF) is no known outage, even after it answered the store: that is
// also how a server turns a client away (a TLS 1.3 server refusing a
// certificate after the client's side of the handshake), and what a load
// balancer whose database is down does.
func outagesStay(t *testing.T, server string, open func(*redirect) *sqlstore.Store) {
	ctx := context.Background()
	r := newRedirect(server)
	s := open(r)
	if _, err := s.Claim(ctx, "s", []string{"answered"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	r.to(testkit.Closing(t, true))
	testkit.RefusedCalls(t, s, 3, "not known to be an outage", false)
	r.to(testkit.Closing(t, false))
	testkit.RefusedCalls(t, s, 3, "not known to be an outage", false)
	closed := testkit.ClosedAddr(t)
	r.to(closed)
	outage(t, "nothing listening, after the server answered", s)
	outage(t, "nothing listening", open(newRedirect(closed)))
}

// TestMySQLRefusalIsNotAnOutage: on a MariaDB of the test's own that
// requires secure transport, with a user that requires a client
// certificate (REQUIRE X509): every refusal of the client fails the claim
// unclassified, however go-sql-driver reports it: an access denied
// (1045), the server's TLS alert refusing a certificate of another
// authority (a network error under TLS 1.2; under TLS 1.3, read after the
// client's handshake, an "invalid connection"), a server certificate the
// client does not trust. A server that is down is still an outage.
func TestMySQLRefusalIsNotAnOutage(t *testing.T) {
	files := testkit.MakeTLSFiles(t)
	other := testkit.MakeTLSFiles(t)
	srv := startMariaDB(t, "--ssl-ca="+files.CA, "--ssl-cert="+files.ServerCert, "--ssl-key="+files.ServerKey)
	// Root on the server's socket: secure transport, whatever is required
	// of TCP clients.
	rootCfg := mysql.NewConfig()
	rootCfg.User, rootCfg.Net, rootCfg.Addr, rootCfg.DBName = "root", "unix", srv.dir+"/sock", "test"
	root := sqltest.OpenDB(t, "mysql", rootCfg.FormatDSN())
	ctx := context.Background()
	for _, stmt := range []string{
		"SET GLOBAL require_secure_transport = ON",
		"CREATE USER x509u REQUIRE X509", "GRANT ALL ON test.* TO x509u",
		"CREATE USER pwu IDENTIFIED BY 'pw'", "GRANT ALL ON test.* TO pwu",
	} {
		if _, err := root.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	table := sqltest.NewStore(t, root, sqlstore.MySQL, sqlstore.Config{}).Table()
	open := func(t *testing.T, user, password, addr string, tlsCfg *tls.Config) *sql.DB {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, password, "tcp", addr, "test"
		cfg.TLS, cfg.Timeout = tlsCfg, 10*time.Second
		return mysqlDB(t, cfg)
	}
	addr := "127.0.0.1:" + strconv.Itoa(srv.port)
	tlsWith := func(certOf *testkit.TLSFiles, max uint16) *tls.Config {
		cfg := files.ClientConfig(t, false)
		if certOf != nil {
			cfg.Certificates = certOf.ClientConfig(t, true).Certificates
		}
		cfg.MaxVersion = max
		return cfg
	}

	good := sqltest.StoreOnDB(t, open(t, "x509u", "", addr, tlsWith(files, 0)), sqlstore.MySQL, table)
	if c, err := good.Claim(ctx, "s", []string{"good"}, time.Minute); err != nil || c.Result != stores.Claimed {
		t.Fatalf("Claim with the client certificate = %+v, %v", c, err)
	}

	untrusting := files.ClientConfig(t, true)
	untrusting.RootCAs = other.ClientConfig(t, false).RootCAs
	for _, c := range []struct {
		name, user, password string
		tls                  *tls.Config
		want                 string
	}{
		{"without a client certificate", "x509u", "", tlsWith(nil, 0), "Error 1045"},
		{"in plain text", "pwu", "pw", nil, "Error 1045"},
		{"with a wrong password", "pwu", "wrong", tlsWith(nil, 0), "Error 1045"},
		{"with a certificate of another authority, TLS 1.2", "x509u", "", tlsWith(other, tls.VersionTLS12), "remote error: tls: unknown certificate authority"},
		{"with a certificate of another authority, TLS 1.3", "x509u", "", tlsWith(other, tls.VersionTLS13), "connection"}, // invalid, or bad when a write met the reset
		{"not trusting the server's certificate", "x509u", "", untrusting, "x509: certificate signed by unknown authority"},
	} {
		t.Run(c.name, func(t *testing.T) {
			testkit.RefusedCalls(t, sqltest.StoreOnDB(t, open(t, c.user, c.password, addr, c.tls), sqlstore.MySQL, table), 3, c.want, false)
		})
	}

	t.Run("FailOpen runs no handler", func(t *testing.T) {
		s := sqltest.StoreOnDB(t, open(t, "x509u", "", addr, tlsWith(other, tls.VersionTLS13)), sqlstore.MySQL, table)
		if ran, err := testkit.FailOpenRun(t, s, 5); ran != 0 || err == nil {
			t.Fatalf("FailOpen with a certificate of another authority: %d of 5 handlers ran unprotected, last error %v", ran, err)
		}
	})

	via := func(t *testing.T, r *redirect, user, password string) *sqlstore.Store {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, password, "tcp", addr, "test"
		cfg.TLS, cfg.Timeout, cfg.DialFunc = tlsWith(nil, 0), 10*time.Second, r.dial
		db := mysqlDB(t, cfg)
		db.SetMaxIdleConns(0) // every call on a connection of its own, from r
		return sqltest.StoreOnDB(t, db, sqlstore.MySQL, table)
	}
	t.Run("a reset after the refusal", func(t *testing.T) {
		resetsAfterRefusal(t, addr, "Error 1045", func(r *redirect) *sqlstore.Store { return via(t, r, "pwu", "wrong") })
	})
	t.Run("outages stay outages", func(t *testing.T) {
		outagesStay(t, addr, func(r *redirect) *sqlstore.Store { return via(t, r, "pwu", "pw") })
	})
	t.Run("a pooled connection broken after a refusal, nothing listening", func(t *testing.T) {
		// The server refused a new connection of the store (the user's
		// password changed, then changed back); then it goes down: the
		// pool's older connection (not checked before use) breaks under
		// the next claim ("invalid connection"), and nothing listens any
		// more. An outage, whatever the server said before.
		p := testkit.NewProxy(t, addr)
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = "pwu", "pw", "tcp", p.Addr(), "test"
		cfg.TLS, cfg.Timeout, cfg.CheckConnLiveness = tlsWith(nil, 0), 10*time.Second, false
		db := mysqlDB(t, cfg)
		db.SetMaxIdleConns(1)
		s := sqltest.StoreOnDB(t, db, sqlstore.MySQL, table)
		if _, err := s.Claim(ctx, "s", []string{"pooled"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		held, err := db.Conn(ctx) // the pool's connection, kept out of the pool meanwhile
		if err != nil {
			t.Fatal(err)
		}
		alter := func(pw string) {
			if _, err := root.ExecContext(ctx, "ALTER USER pwu IDENTIFIED BY '"+pw+"'"); err != nil {
				t.Fatal(err)
			}
		}
		alter("other")
		defer alter("pw")
		if _, err := s.Claim(ctx, "s", []string{"refused"}, time.Minute); !errors.Is(err, sqlstore.ErrRefused) {
			t.Fatalf("Claim on a new connection with the password changed: %v, want ErrRefused", err)
		}
		alter("pw")
		_ = held.Close() // back to the pool
		p.Cut()
		outage(t, "the pool's connection broken and nothing listening, after a refusal", s)
	})
}

// copyFile copies from to to (a certificate a server reads again).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestMySQLCertNoLongerTrusted: a MariaDB that has answered the store
// stops trusting the authority of the client's certificate (its CA file
// replaced, then FLUSH SSL, or a restart). The server is up and refuses
// every new connection, under TLS 1.3 after the client's side of the
// handshake, which go-sql-driver reports only as "invalid connection",
// as it reports a connection killed under it. No claim is an outage, and
// a fail-open consumer runs no handler: the store confirms such an error
// with a new connection of the pool, whose dial succeeds.
func TestMySQLCertNoLongerTrusted(t *testing.T) {
	files := testkit.MakeTLSFiles(t)
	other := testkit.MakeTLSFiles(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, files.CA, ca)
	srv := startMariaDB(t, "--ssl-ca="+ca, "--ssl-cert="+files.ServerCert, "--ssl-key="+files.ServerKey)
	ctx := context.Background()
	for _, stmt := range []string{"CREATE USER x509u REQUIRE X509", "GRANT ALL ON test.* TO x509u"} {
		if _, err := srv.socket(t, "test").ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	table := sqltest.NewStore(t, srv.socket(t, "test"), sqlstore.MySQL, sqlstore.Config{}).Table()
	open := func(t *testing.T) *sql.DB {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "x509u", "tcp", "127.0.0.1:"+strconv.Itoa(srv.port), "test"
		cfg.TLS, cfg.Timeout = files.ClientConfig(t, true), 10*time.Second
		cfg.TLS.MinVersion, cfg.TLS.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
		return mysqlDB(t, cfg)
	}
	for _, c := range []struct {
		name   string
		rotate func(t *testing.T, db *sql.DB)
	}{
		{"FLUSH SSL", func(t *testing.T, db *sql.DB) {
			if _, err := srv.socket(t, "").ExecContext(ctx, "FLUSH SSL"); err != nil {
				t.Fatal(err)
			}
			db.SetMaxIdleConns(0) // every call on a new connection, as a pool recycles its own
		}},
		{"restart", func(*testing.T, *sql.DB) {
			// The pool's connections are reset by the restart; the server
			// comes back refusing the certificate.
			srv.restart()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			copyFile(t, files.CA, ca)
			if _, err := srv.socket(t, "").ExecContext(ctx, "FLUSH SSL"); err != nil {
				t.Fatal(err)
			}
			db := open(t)
			s := sqltest.StoreOnDB(t, db, sqlstore.MySQL, table)
			if _, err := s.Claim(ctx, "s", []string{"answered-" + c.name}, time.Minute); err != nil {
				t.Fatalf("Claim with the certificate trusted: %v", err)
			}
			copyFile(t, other.CA, ca)
			c.rotate(t, db)
			testkit.RefusedCalls(t, s, 5, "connection", false) // invalid, or bad when a write met the reset
			if ran, err := testkit.FailOpenRun(t, s, 5); ran != 0 || err == nil {
				t.Fatalf("FailOpen with the client certificate no longer trusted: %d of 5 handlers ran unprotected, last error %v", ran, err)
			}
		})
	}
}

// TestPostgresCertNoLongerTrustedPool: a PostgreSQL that answered the
// store stops trusting the authority of the client's certificate
// (ssl_ca_file replaced, pg_reload_conf) while a pool under load keeps
// its older connections, which go on serving. Every new connection is
// refused, by the server's alert or by the reset that overtakes it (pgx:
// failed to write startup message: connection reset by peer). No claim
// is an outage: a connection that failed while it was being set up is a
// server that is up and does not take the client, whatever the store
// heard from it before.
func TestPostgresCertNoLongerTrustedPool(t *testing.T) {
	srv, table := pgRefusalServer(t, "ssl_min_protocol_version = 'TLSv1.3'")
	other := testkit.MakeTLSFiles(t)
	clientCA := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, srv.CA, clientCA) // the client keeps trusting the server
	params := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {clientCA}, "sslcert": {srv.TLS.ClientCert}, "sslkey": {srv.TLS.ClientKey}}
	db := sqltest.OpenDB(t, "pgx", srv.DSN("dedup-client", "", "test", params))
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(2) // the rest of the 8 dialled again and again
	s := sqltest.StoreOnDB(t, db, sqlstore.Postgres, table)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { // connections of the pool, set up while the certificate is trusted
			if _, err := s.Claim(ctx, "s", []string{"warm-" + storetest.NewID()}, time.Minute); err != nil {
				t.Errorf("Claim with the certificate trusted: %v", err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	copyFile(t, other.CA, srv.CA)
	srv.Exec("postgres", "SELECT pg_reload_conf()")

	var (
		mu       sync.Mutex
		ok, fail int
		outages  []error
	)
	for range 8 {
		wg.Go(func() {
			for range 250 {
				_, err := s.Claim(ctx, "s", []string{"k-" + storetest.NewID()}, time.Minute)
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, stores.ErrUnavailable) || cycle.IsOutage(err):
					outages = append(outages, err)
				default:
					fail++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("claims after the certificate's authority was replaced: %d served by older connections, %d refused, %d outages", ok, fail, len(outages))
	for i, err := range outages {
		if i == 3 {
			break
		}
		t.Errorf("an outage while the server refuses the certificate: %v", err)
	}
	if fail == 0 {
		t.Fatal("no claim was refused: the server still takes the certificate")
	}
}

// mysqlDB opens a database on cfg, closed when t ends.
func mysqlDB(t *testing.T, cfg *mysql.Config) *sql.DB {
	t.Helper()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
