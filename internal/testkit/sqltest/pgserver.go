//go:build linux

package sqltest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// PostgresServer is a PostgreSQL cluster of a test's own (initdb in a
// directory of its own, a postgres on a free loopback port), for server
// settings the shared one must keep: its pg_hba.conf, TLS with client
// certificates, a minimum TLS version. The superuser is postgres, trusted
// on the server's Unix socket (Admin); TCP clients get what the test's
// pg_hba.conf lines give them.
type PostgresServer struct {
	Port int
	Dir  string // its data directory's parent: the socket, the log, the certificates
	// TLS holds the files of the authority that signed the server's
	// certificate and a client certificate (CN dedup-client).
	TLS *testkit.TLSFiles
	// CA is TLS.CA copied where the server reads it; ServerCert likewise.
	CA string

	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPostgres makes a cluster with initdb and starts it with TLS on
// (ssl_ca_file: the files' authority, so clients may present certificates
// it signed), the pg_hba.conf lines hba after a line trusting the Unix
// socket, and the postgresql.conf lines conf. It returns once the server
// answers on its socket; the server is shut down (by its PID) and its
// directory removed when t ends. Run as root, the cluster runs as the
// postgres user, whom initdb requires. Without the PostgreSQL server
// binaries (/usr/lib/postgresql/*/bin) the test fails naming them (see
// Unavailable).
func StartPostgres(t testing.TB, hba, conf string) *PostgresServer {
	t.Helper()
	bin := postgresBin(t)
	var cred *syscall.Credential
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testkit.Unavailable(t, "a postgres user (to run a PostgreSQL cluster of the test's own as root)", "/etc/passwd", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// A directory of its own outside t.TempDir(), whose parents are
	// root's alone: the cluster's user must reach it.
	dir, err := os.MkdirTemp("", "dedup-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &PostgresServer{Dir: dir, TLS: testkit.MakeTLSFiles(t), t: t}
	own := func(path string) {
		if cred != nil {
			if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	own(dir)
	copyFile := func(from, name string, mode os.FileMode) string {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dir, name)
		if err := os.WriteFile(to, b, mode); err != nil {
			t.Fatal(err)
		}
		own(to)
		return to
	}
	s.CA = copyFile(s.TLS.CA, "ca.pem", 0o644)
	cert := copyFile(s.TLS.ServerCert, "server.pem", 0o644)
	key := copyFile(s.TLS.ServerKey, "server.key", 0o600)

	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte("local all all trust\n"+hba+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	own(filepath.Join(data, "pg_hba.conf"))

	var lastErr error
	for range 5 {
		s.Port = testkit.FreePort(t)
		settings := fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"+
			"ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\nssl_ca_file = '%s'\n"+
			"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 16MB\nmax_connections = 40\n"+
			"logging_collector = off\n%s\n", s.Port, dir, cert, key, s.CA, conf)
		auto := filepath.Join(data, "postgresql.auto.conf")
		if err := os.WriteFile(auto, []byte(settings), 0o600); err != nil {
			t.Fatal(err)
		}
		own(auto)
		if lastErr = s.start(bin, data, cred); lastErr == nil {
			return s
		}
	}
	t.Fatalf("could not start a PostgreSQL cluster: %v", lastErr)
	return nil
}

// start starts postgres and waits until it answers on its socket.
func (s *PostgresServer) start(bin, data string, cred *syscall.Credential) error {
	logFile, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	testkit.SetPdeathsig(cmd) // a test binary that dies (a timeout) takes its server along
	if cred != nil {
		cmd.SysProcAttr.Credential = cred
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	db, err := sql.Open("pgx", s.socketDSN("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	for deadline := time.Now().Add(time.Minute); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			s.t.Cleanup(s.stop)
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(s.LogPath())
			return fmt.Errorf("postgres on port %d exited: %v\n%s", s.Port, err, testkit.LastLines(strings.Split(string(log), "\n"), 20))
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("postgres on port %d does not answer: %v", s.Port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop shuts the server down (SIGINT, a fast shutdown, by its PID), and
// kills it after 30s.
func (s *PostgresServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Stop shuts the server down and waits for it to exit: a server that is
// down, for a test of what a client says then.
func (s *PostgresServer) Stop() { s.stop() }

// LogPath is the file the server logs to.
func (s *PostgresServer) LogPath() string { return filepath.Join(s.Dir, "postgres.log") }

// Addr is the server's TCP address, 127.0.0.1:port.
func (s *PostgresServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// DSN is a URL to database db over TCP as user (with password, unless
// empty), with the query parameters params (sslmode, sslcert, ...).
func (s *PostgresServer) DSN(user, password, db string, params url.Values) string {
	u := url.URL{Scheme: "postgres", Host: s.Addr(), Path: "/" + db, RawQuery: params.Encode()}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	return u.String()
}

func (s *PostgresServer) socketDSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", s.Dir, s.Port, db)
}

// Admin opens database db as the superuser, over the server's socket,
// closed when the test ends.
func (s *PostgresServer) Admin(db string) *sql.DB {
	s.t.Helper()
	conn, err := sql.Open("pgx", s.socketDSN(db))
	if err != nil {
		s.t.Fatal(err)
	}
	conn.SetMaxOpenConns(4)
	s.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Exec runs each statement as the superuser in database db, failing the
// test on an error.
func (s *PostgresServer) Exec(db string, stmts ...string) {
	s.t.Helper()
	conn, err := sql.Open("pgx", s.socketDSN(db))
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	for _, stmt := range stmts {
		if _, err := conn.Exec(stmt); err != nil {
			s.t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// postgresBin is the directory of the newest PostgreSQL server binaries.
func postgresBin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	testkit.Unavailable(t, "the PostgreSQL server binaries initdb and postgres (to start a cluster of the test's own)", "/usr/lib/postgresql/*/bin", os.ErrNotExist)
	return ""
}
