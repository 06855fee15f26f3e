package sqlstore_test

import (
	"context"
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-dedup/dedup/internal/testkit"
)

// mariaDB is a MariaDB server of a test's own, on a loopback port of its
// own, for server settings the shared one must keep (max_allowed_packet,
// read_only, max_connections): its data directory is made with
// mariadb-install-db, which takes about a second, as does its start.
type mariaDB struct {
	t    *testing.T
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// startMariaDB starts a mariadbd with the extra arguments (such as
// "--max-allowed-packet=1M"), killed by PID when t ends.
func startMariaDB(t *testing.T, args ...string) *mariaDB {
	t.Helper()
	install, err := exec.LookPath("mariadb-install-db")
	if err == nil {
		_, err = exec.LookPath("mariadbd")
	}
	if err != nil {
		testkit.Unavailable(t, "mariadbd and mariadb-install-db (to start a MariaDB of the test's own)", "$PATH", err)
	}
	m := &mariaDB{t: t, dir: t.TempDir()}
	data := filepath.Join(m.dir, "data")
	if out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--user="+currentUser()).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	m.args = args
	m.start()
	t.Cleanup(m.kill)
	root := m.open(t, "")
	if _, err := root.Exec("CREATE DATABASE test"); err != nil {
		t.Fatal(err)
	}
	return m
}

// start starts mariadbd on m's data directory and port with m.args, and
// returns once it answers on its socket.
func (m *mariaDB) start() {
	t := m.t
	m.cmd = exec.Command("mariadbd", append([]string{"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"),
		"--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1", "--socket=" + filepath.Join(m.dir, "sock"),
		"--pid-file=" + filepath.Join(m.dir, "pid"), "--user=" + currentUser(), "--skip-log-bin",
		"--innodb-buffer-pool-size=16M", "--log-error=" + filepath.Join(m.dir, "error.log")}, m.args...)...)
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("starting mariadbd: %v", err)
	}
	done := make(chan struct{})
	m.done = done
	cmd := m.cmd
	go func() { _ = cmd.Wait(); close(done) }()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "unix", filepath.Join(m.dir, "sock")
	sock, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := sock.PingContext(context.Background())
		if err == nil {
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
			t.Fatalf("mariadbd exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mariadbd on port %d does not answer: %v", m.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills mariadbd by its PID (SIGKILL) and waits for it to exit.
func (m *mariaDB) kill() {
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// restart kills mariadbd and starts it again on the same data, port and
// arguments (files it reads at its start, such as --ssl-ca, read anew).
func (m *mariaDB) restart() {
	m.kill()
	m.start()
}

// socket opens database db ("" for none) as root on the server's Unix
// socket, closed when t ends: secure transport, whatever is required of
// TCP clients.
func (m *mariaDB) socket(t *testing.T, db string) *sql.DB {
	t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "unix", filepath.Join(m.dir, "sock"), db
	conn, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dsn is the DSN of database db ("" for none) as root, with params.
func (m *mariaDB) dsn(db string, params map[string]string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", "127.0.0.1:"+strconv.Itoa(m.port), db
	cfg.Params = params
	return cfg.FormatDSN()
}

// open opens database db ("" for none), closed when t ends.
func (m *mariaDB) open(t *testing.T, db string) *sql.DB {
	t.Helper()
	conn, err := sql.Open("mysql", m.dsn(db, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func currentUser() string {
	if os.Getuid() == 0 {
		return "root"
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return strconv.Itoa(os.Getuid())
}
