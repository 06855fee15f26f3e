package acceptance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/stores"
)

// Child consumer processes.
//
// The crash scenario on a Restartable backend with a MultiProcess store
// runs its consumers as child processes: the test binary itself, started
// with -test.run selecting the scenario's subtest and the childEnvVar
// variable holding a childSpec. Run sees the variable and turns the
// subtest into a consumer that reports what it does on file descriptor 3,
// one line per fact, until its standard input closes (a graceful stop) or
// the parent SIGKILLs it at a crash point.
//
// Lines: "R" ready; "D id uuid event" delivered; "H id 0|1" handled
// (1: success); "E id event" effect; "B id event" store entered; "C id
// event ok|lost|err" Complete or commit; "T id event op ..." a store
// call traced (see traceLine); "I id" acked after a failed
// Complete (under AsyncComplete: a Complete that had not landed when the
// middleware was closed on a graceful stop); "O outcome scope" metrics;
// "X id event point" crashing now.

const childEnvVar = "ACCEPTANCE_CHILD"

type childSpec struct {
	Test     string // the scenario subtest's t.Name()
	Backend  Env
	Store    Env
	Consumer consumerSpec
}

var childOnce = sync.OnceValue(func() *childSpec {
	v := os.Getenv(childEnvVar)
	if v == "" {
		return nil
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "acceptance: bad %s: %v\n", childEnvVar, err)
		os.Exit(2)
	}
	return &spec
})

// childSpecFromEnv returns the spec of this child process, or nil in the
// test process.
func childSpecFromEnv() *childSpec { return childOnce() }

// IsChild reports whether this process is a child consumer started by the
// crash scenario. TestMain functions should skip work such as printing the
// summary in it.
func IsChild() bool { return childSpecFromEnv() != nil }

// ---- the child side

// runChild runs the consumer of spec until stdin closes.
func runChild(t *testing.T, b Backend, s Store, spec *childSpec) {
	if t.Name() != spec.Test {
		return
	}
	pipe := os.NewFile(3, "acceptance-report")
	if pipe == nil {
		t.Fatal("acceptance child: no report pipe on fd 3")
	}
	w := &lineWriter{w: pipe}
	o, err := s.Open(t, spec.Store)
	if err != nil {
		t.Fatalf("acceptance child: open store: %v", err)
	}
	t.Cleanup(func() { _ = o.Store.Close(context.Background()) })
	sub, err := newSubscriber(t, b, spec.Backend, spec.Consumer)
	if err != nil {
		t.Fatalf("acceptance child: subscriber: %v", err)
	}
	pub, err := b.NewPublisher(t, spec.Backend)
	if err != nil {
		t.Fatalf("acceptance child: publisher: %v", err)
	}
	stdinClosed := make(chan struct{})
	sk := &pipeSink{w: w, plan: map[string]bool{}, hangs: map[string]bool{}, stdinClosed: stdinClosed}
	for ev := range spec.Consumer.Crash {
		sk.plan[ev] = true
	}
	for ev := range spec.Consumer.Hang {
		sk.hangs[ev] = true
	}
	core := newConsumerCore(spec.Consumer, sk, o, b, s, logger())
	p := newProc()
	core.currentProc = func() *proc { return p }
	never := make(chan struct{})
	core.dead = never
	router, err := core.router(sub, noClose{pub})
	if err != nil {
		t.Fatalf("acceptance child: %v", err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- router.Run(t.Context()) }()
	<-router.Running()
	w.line("R")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	close(stdinClosed)
	_ = router.Close()
	if err := <-stopped; err != nil {
		t.Errorf("acceptance child: router: %v", err)
	}
	// AsyncComplete: wait for the Completes in flight before exiting, and
	// report ("I") the acked deliveries whose Complete never landed.
	if err := core.closeMiddleware(p); err != nil {
		t.Errorf("acceptance child: closing the middleware: %v", err)
	}
	_ = sub.Close()
	_ = pub.Close()
}

type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) line(fields ...string) {
	for i, f := range fields {
		if f == "" {
			fields[i] = "-"
		}
	}
	s := strings.Join(fields, " ") + "\n"
	l.mu.Lock()
	_, _ = io.WriteString(l.w, s)
	l.mu.Unlock()
}

// pipeSink reports to the parent.
type pipeSink struct {
	w           *lineWriter
	mu          sync.Mutex
	plan        map[string]bool
	hangs       map[string]bool
	stdinClosed chan struct{}
}

func id(d *delivery) string { return strconv.FormatUint(d.id, 10) }

func (s *pipeSink) Observe(scope string, o dedup.Outcome) {
	s.w.line("O", strconv.Itoa(int(o)), scope)
}
func (s *pipeSink) ObserveStore(string, string, time.Duration, error) {}
func (s *pipeSink) delivered(d *delivery)                             { s.w.line("D", id(d), d.uuid, d.event) }
func (s *pipeSink) handled(d *delivery, err error) {
	ok := "1"
	if err != nil {
		ok = "0"
	}
	s.w.line("H", id(d), ok)
}
func (s *pipeSink) effect(d *delivery, event string)     { s.w.line("E", id(d), event) }
func (s *pipeSink) storeCalled(d *delivery, c storeCall) { s.w.line(traceLine(id(d), c)...) }
func (s *pipeSink) incomplete(d *delivery)               { s.w.line("I", id(d)) }
func (s *pipeSink) entered(d *delivery)                  { s.w.line("B", id(d), d.event) }
func (s *pipeSink) completed(d *delivery, err error) {
	res := "ok"
	switch {
	case errors.Is(err, stores.ErrLostClaim):
		res = "lost"
	case err != nil:
		res = "err"
	}
	s.w.line("C", id(d), d.event, res)
}

func take(mu *sync.Mutex, plan map[string]bool, event string) bool {
	mu.Lock()
	defer mu.Unlock()
	if !plan[event] {
		return false
	}
	delete(plan, event)
	return true
}

func (s *pipeSink) claimCrash(event string) bool { return take(&s.mu, s.plan, event) }
func (s *pipeSink) claimHang(event string) bool  { return take(&s.mu, s.hangs, event) }

// crash tells the parent, which SIGKILLs this process; it does not
// return. A child whose parent is gone exits when its stdin closes.
func (s *pipeSink) crash(d *delivery, point crashPoint) error {
	s.w.line("X", id(d), d.event, string(point))
	<-s.stdinClosed
	os.Exit(3)
	return errCrashed
}

// hang does not hang in a child: no scenario hangs child consumers.
func (s *pipeSink) hang(*delivery) bool { return true }

// ---- the parent side

// childConsumer is a consumer running in a child process.
type childConsumer struct {
	r    *run
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser

	ready   chan struct{}
	readEOF chan struct{}
	exited  chan struct{}
	waitErr error

	mu       sync.Mutex
	uuids    map[string]string // delivery id -> message uuid
	pending  map[string]bool   // delivery ids with an effect and no Complete
	killed   bool
	stopping bool
	output   tailBuffer
	stopOnce sync.Once
}

// childPattern is the -test.run pattern selecting exactly the test name.
func childPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// startChild starts a child consumer and waits until its router runs.
func (r *run) startChild(spec consumerSpec) *childConsumer {
	r.t.Helper()
	r.used(spec.Topic, spec.Group)
	raw, err := json.Marshal(childSpec{Test: r.t.Name(), Backend: r.benv, Store: r.senv, Consumer: spec})
	if err != nil {
		r.t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	c := &childConsumer{
		r: r, name: spec.Name,
		ready: make(chan struct{}), readEOF: make(chan struct{}), exited: make(chan struct{}),
		uuids: map[string]string{}, pending: map[string]bool{},
	}
	args := []string{"-test.run=" + childPattern(r.t.Name()), "-test.count=1", "-test.timeout=15m", "-test.parallel=1"}
	if os.Getenv("ACCEPTANCE_LOG") != "" {
		args = append(args, "-test.v")
	}
	c.cmd = exec.Command(os.Args[0], args...)
	c.cmd.Env = append(os.Environ(), childEnvVar+"="+string(raw))
	c.cmd.ExtraFiles = []*os.File{pw}
	c.cmd.Stdout = &c.output
	c.cmd.Stderr = &c.output
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		r.t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		r.t.Fatalf("start child consumer %s: %v", spec.Name, err)
	}
	_ = pw.Close() // the child holds the write end now
	go c.read(pr)
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
		c.mu.Lock()
		expected := c.killed || c.stopping
		c.mu.Unlock()
		if !expected && !r.ended() {
			r.t.Errorf("child consumer %s exited on its own: %v\n%s", c.name, c.waitErr, c.output.String())
		}
	}()
	r.t.Cleanup(c.stop)
	r.addStopper(c.stop)
	select {
	case <-c.ready:
	case <-c.exited:
		r.t.Fatalf("child consumer %s exited before it was ready: %v\n%s", c.name, c.waitErr, c.output.String())
	case <-time.After(2 * time.Minute):
		r.t.Fatalf("child consumer %s not ready after two minutes\n%s", c.name, c.output.String())
	}
	return c
}

// read handles the child's report lines until the pipe closes.
func (c *childConsumer) read(pr *os.File) {
	defer close(c.readEOF)
	defer pr.Close()
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		c.handleLine(strings.Fields(sc.Text()))
	}
}

func (c *childConsumer) handleLine(f []string) {
	r := c.r
	arg := func(i int) string {
		if i < len(f) && f[i] != "-" {
			return f[i]
		}
		return ""
	}
	d := func() *delivery {
		n, _ := strconv.ParseUint(arg(1), 10, 64)
		return &delivery{id: n, consumer: c.name}
	}
	switch arg(0) {
	case "R":
		close(c.ready)
	case "D":
		dv := d()
		dv.uuid, dv.event = arg(2), arg(3)
		c.mu.Lock()
		c.uuids[arg(1)] = dv.uuid
		c.mu.Unlock()
		r.delivered(dv)
	case "H":
		dv := d()
		c.mu.Lock()
		dv.uuid = c.uuids[arg(1)]
		delete(c.uuids, arg(1))
		c.mu.Unlock()
		var err error
		if arg(2) != "1" {
			err = errCrashed
		}
		r.handled(dv, err)
	case "E":
		c.mu.Lock()
		c.pending[arg(1)] = true
		c.mu.Unlock()
		r.effect(d(), arg(2))
	case "B":
		dv := d()
		dv.event = arg(2)
		r.entered(dv)
	case "C":
		dv := d()
		dv.event = arg(2)
		var err error
		switch arg(3) {
		case "ok":
			c.mu.Lock()
			delete(c.pending, arg(1))
			c.mu.Unlock()
		case "lost":
			err = stores.ErrLostClaim
		default:
			err = errors.New("complete failed")
		}
		r.completed(dv, err)
	case "T":
		fields := make([]string, traceFields)
		for i := range fields {
			fields[i] = arg(i)
		}
		r.traced(parseTrace(c.name+"/"+arg(1), fields))
	case "I":
		r.incomplete(nil)
	case "O":
		n, _ := strconv.Atoi(arg(1))
		r.Observe(arg(2), dedup.Outcome(n))
	case "X":
		r.crashes <- crashNote{consumer: c.name, delivery: d().key(), event: arg(2), point: crashPoint(arg(3)), kill: c.kill}
	}
}

// kill SIGKILLs the child and returns how many deliveries it caught
// between their effect and their Complete.
func (c *childConsumer) kill() int {
	c.mu.Lock()
	c.killed = true
	c.mu.Unlock()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
	<-c.readEOF // every line written before the kill is handled
	c.r.dropInflight(c.name)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// stop closes the child's stdin and waits for it to exit, killing it when
// it does not. It is idempotent.
func (c *childConsumer) stop() { c.stopOnce.Do(c.doStop) }

func (c *childConsumer) doStop() {
	c.r.finish()
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	_ = c.in.Close()
	select {
	case <-c.exited:
	case <-time.After(45 * time.Second):
		c.r.t.Errorf("child consumer %s did not stop within 45s; killing it\n%s", c.name, c.output.String())
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	}
	<-c.readEOF
	c.mu.Lock()
	killed := c.killed
	c.mu.Unlock()
	if !killed && c.waitErr != nil {
		c.r.t.Errorf("child consumer %s: %v\n%s", c.name, c.waitErr, c.output.String())
	}
}

// tailBuffer keeps the last 32 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 32 << 10

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > tailMax {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-tailMax:]...)
	}
	b.mu.Unlock()
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
