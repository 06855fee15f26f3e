package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hungServer is a loopback listener that accepts every connection and
// never answers: a hung server, or something that is not the server the
// client expects. accepted closes at its first connection, spoke when a
// client first sent it bytes (a request waiting for its answer).
type hungServer struct {
	ln       net.Listener
	accepted chan struct{}
	spoke    chan struct{}

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	once   [2]sync.Once
	wg     sync.WaitGroup
}

func newHungServer(t *testing.T) *hungServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &hungServer{ln: ln, accepted: make(chan struct{}), spoke: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *hungServer) addr() string { return s.ln.Addr().String() }

func (s *hungServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns = append(s.conns, c)
		s.wg.Add(1)
		s.mu.Unlock()
		s.once[0].Do(func() { close(s.accepted) })
		go func() {
			defer s.wg.Done()
			// Read and drop, never write.
			var b [512]byte
			for {
				n, err := c.Read(b[:])
				if n > 0 {
					s.once[1].Do(func() { close(s.spoke) })
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (s *hungServer) close() {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	_ = s.ln.Close()
	s.wg.Wait()
}

// exitBound is how long the example may take to exit, after a signal or
// with a server that never answers: far more than it needs (seconds), far
// less than the hangs it replaces (6 minutes in Sarama, 32s in amqp091).
const exitBound = 20 * time.Second

// startedExample is the example binary running in the background.
type startedExample struct {
	cmd            *exec.Cmd
	args           []string
	stdout, stderr bytes.Buffer
	done           chan struct{}
	err            error
}

func startExample(t *testing.T, args ...string) *startedExample {
	t.Helper()
	bin := buildExample(t)
	args = append([]string{"-events=20", "-run-id=" + newTestRunID()}, args...)
	e := &startedExample{cmd: exec.Command(bin, args...), args: args, done: make(chan struct{})}
	e.cmd.Env = exampleEnv()
	e.cmd.Stdout, e.cmd.Stderr = &e.stdout, &e.stderr
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.err = e.cmd.Wait(); close(e.done) }()
	t.Cleanup(func() {
		select {
		case <-e.done:
		default:
			_ = e.cmd.Process.Kill()
			<-e.done
		}
	})
	return e
}

// wait waits for the example to exit within exitBound, and returns how
// it ended.
func (e *startedExample) wait(t *testing.T) exampleRun {
	t.Helper()
	timer := time.NewTimer(exitBound)
	defer timer.Stop()
	select {
	case <-e.done:
	case <-timer.C:
		_ = e.cmd.Process.Kill()
		<-e.done
		t.Fatalf("router_example %s did not exit within %s\nstdout:\n%s\nstderr:\n%s", strings.Join(e.args, " "), exitBound, e.stdout.String(), tail(e.stderr.String(), 3000))
	}
	r := exampleRun{args: e.args, stdout: e.stdout.String(), stderr: e.stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(e.err, &exit):
		r.code = exit.ExitCode()
	case e.err != nil:
		t.Fatalf("router_example %v: %v", e.args, e.err)
	}
	return r
}

// awaitEvent waits for ev, the hung server's sign that the example is in
// its set-up, connecting to it.
func awaitEvent(t *testing.T, e *startedExample, ev <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case <-ev:
	case <-e.done:
		t.Fatalf("the example exited before %s\n%s", what, e.stderr.String())
	case <-timer.C:
		t.Fatalf("the example never %s\n%s", what, e.stderr.String())
	}
}

// A broker that accepts connections and never answers is reported as
// not reachable, naming its address and the setting, within seconds
// (#23: Kafka blocked 6 minutes in Sarama's NewSyncProducer; RabbitMQ 32
// seconds, then said the server refused the credentials; Redis Streams
// printed no error, then after 20 seconds a zero summary, exit 1).
func TestExampleHungBroker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args func(addr string) []string
		want func(addr string) []string
	}{
		{"kafka", func(a string) []string { return []string{"-broker=kafka", "-kafka-brokers=" + a} },
			func(a string) []string {
				return []string{"Kafka is not reachable at " + a, "-kafka-brokers or KAFKA_BROKERS", "no answer within"}
			}},
		{"amqp", func(a string) []string { return []string{"-broker=amqp", "-amqp-url=amqp://guest:secret@" + a + "/"} },
			func(a string) []string {
				return []string{"RabbitMQ is not reachable at " + a, "-amqp-url or AMQP_URL", "no answer within"}
			}},
		{"redis-streams", func(a string) []string { return []string{"-broker=redis-streams", "-redis-addr=" + a} },
			func(a string) []string {
				return []string{"Redis is not reachable at " + a, "-redis-addr or REDIS_ADDR", "no answer within"}
			}},
		{"nats", func(a string) []string { return []string{"-broker=nats", "-nats-url=nats://" + a} },
			func(a string) []string {
				return []string{"NATS is not reachable at nats://" + a, "-nats-url or NATS_URL"}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newHungServer(t)
			r := startExample(t, tc.args(srv.addr())...).wait(t)
			if r.code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s", r.code, exitConfig, r)
			}
			for _, w := range tc.want(srv.addr()) {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q\n%s", w, r)
				}
			}
			// It did not answer: it refused nothing.
			if strings.Contains(r.stderr, "refused") || strings.Contains(r.stderr, "secret") || r.invariant() != "" {
				t.Errorf("says the server refused, shows the password or prints a verdict\n%s", r)
			}
			requireOnlyOwnLines(t, r)
		})
	}
}

// A signal ends the example at any moment, its set-up included: while it
// waits for a broker or a store that never answers, SIGINT (or SIGTERM)
// makes it exit at once, saying it was interrupted (#23: Kafka and
// RabbitMQ ignored SIGINT until their own time-outs, 6 minutes and 32
// seconds).
func TestExampleSignalDuringSetUp(t *testing.T) {
	t.Parallel()
	type event int
	const (
		spoke    event = iota // the client sent a request: it waits for the answer
		accepted              // the server speaks first (MySQL, NATS): the client waits for it
	)
	for _, tc := range []struct {
		name string
		args func(addr string) []string
		ev   event
		sig  os.Signal
	}{
		{"broker kafka", func(a string) []string { return []string{"-broker=kafka", "-kafka-brokers=" + a} }, spoke, os.Interrupt},
		{"broker kafka SIGTERM", func(a string) []string { return []string{"-broker=kafka", "-kafka-brokers=" + a} }, spoke, syscall.SIGTERM},
		{"broker amqp", func(a string) []string { return []string{"-broker=amqp", "-amqp-url=amqp://guest:guest@" + a + "/"} }, spoke, os.Interrupt},
		{"broker redis-streams", func(a string) []string { return []string{"-broker=redis-streams", "-redis-addr=" + a} }, spoke, os.Interrupt},
		{"broker nats", func(a string) []string { return []string{"-broker=nats", "-nats-url=nats://" + a} }, accepted, os.Interrupt},
		{"broker postgres", func(a string) []string {
			return []string{"-broker=postgres", "-postgres-dsn=postgres://postgres@" + a + "/test?sslmode=disable"}
		}, spoke, os.Interrupt},
		{"broker mysql", func(a string) []string { return []string{"-broker=mysql", "-mysql-dsn=root@tcp(" + a + ")/test"} }, accepted, os.Interrupt},
		{"store redis", func(a string) []string { return []string{"-store=redis", "-redis-addr=" + a} }, spoke, os.Interrupt},
		{"store postgres", func(a string) []string {
			return []string{"-store=postgres", "-postgres-dsn=postgres://postgres@" + a + "/test?sslmode=disable"}
		}, spoke, os.Interrupt},
		{"store mysql", func(a string) []string { return []string{"-store=mysql", "-mysql-dsn=root@tcp(" + a + ")/test"} }, accepted, os.Interrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newHungServer(t)
			e := startExample(t, tc.args(srv.addr())...)
			if tc.ev == spoke {
				awaitEvent(t, e, srv.spoke, "sent the server a request")
			} else {
				awaitEvent(t, e, srv.accepted, "connected to the server")
			}
			if err := e.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			r := e.wait(t)
			if r.code != exitBroken || !strings.Contains(r.stderr, "router_example: interrupted") {
				t.Fatalf("after a signal during set-up: exit %d, want %d and a line saying it was interrupted\n%s", r.code, exitBroken, r)
			}
			if strings.Contains(r.stderr, "not reachable") || strings.Contains(r.stderr, "refused") || r.invariant() != "" {
				t.Errorf("an interrupted set-up reported the server, or a verdict\n%s", r)
			}
			requireOnlyOwnLines(t, r)
		})
	}
}

// await returns at once when its context ends (a signal), or when its
// time-out passes, and closes what the abandoned step opens after that.
func TestAwait(t *testing.T) {
	t.Run("returns the step's result", func(t *testing.T) {
		v, err := await(t.Context(), "adding", func() (int, error) { return 42, nil }, nil)
		if v != 42 || err != nil {
			t.Fatalf("got %d, %v", v, err)
		}
		want := errors.New("refused")
		if _, err := await(t.Context(), "adding", func() (int, error) { return 0, want }, nil); err != want {
			t.Fatalf("got %v, want the step's own error", err)
		}
	})
	for _, tc := range []struct {
		name    string
		cancel  bool
		timeout time.Duration
		check   func(t *testing.T, err error)
	}{
		{"a signal", true, time.Hour, func(t *testing.T, err error) {
			if !errors.Is(err, errInterrupted) || interruption(err) != "interrupted while connecting to X" {
				t.Fatalf("got %v, want errInterrupted saying what it interrupted", err)
			}
		}},
		{"a time-out", false, 10 * time.Millisecond, func(t *testing.T, err error) {
			var te *stepTimeoutError
			if !errors.As(err, &te) || err.Error() != "connecting to X: no answer within 10ms" {
				t.Fatalf("got %v, want a *stepTimeoutError", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			release, discarded := make(chan struct{}), make(chan int, 1)
			step := func() (int, error) { <-release; return 7, nil } // a library call that ignores ctx
			if tc.cancel {
				cancel()
			}
			_, err := awaitWithin(ctx, tc.timeout, "connecting to X", step, func(v int) { discarded <- v })
			tc.check(t, err)
			close(release) // the step finishes after all: what it opened is closed
			if v := <-discarded; v != 7 {
				t.Fatalf("discarded %d, want the late result 7", v)
			}
		})
	}
}
