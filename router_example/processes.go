package main

// The kill demo: -processes=N runs N consumer processes of this binary
// (-consumer-process, processes_consumer.go) on a shared broker and
// store, and -kill-every=D SIGKILLs one of them every D and starts a
// replacement. This process hosts the broker (the in-process Kafka, on a
// loopback port; or uses -broker=kafka), opens the store (SQLite in a
// directory the processes share, or PostgreSQL, MySQL), creates the
// ledger, publishes the events, follows every delivery from the
// processes' reports, and checks the ledger at the end as a run in one
// process does. Every process it starts is in a process group of its
// own, dies with it (Linux: the parent-death signal) and is killed and
// reaped when it ends, whatever ends it.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cliflag"
)

// Session timeouts of the consumer processes' group when
// -kafka-session-timeout is not set: a SIGKILLed consumer holds its
// partitions this long. The in-process Kafka accepts 2s; a real broker
// refuses less than its group.min.session.timeout.ms, 6s by default.
const (
	embeddedSessionTimeout = 2 * time.Second
	kafkaSessionTimeout    = 6 * time.Second
)

// stopGrace is how long a consumer process has to stop after SIGTERM
// (the router's CloseTimeout, routerCloseTimeout) before it is SIGKILLed.
const stopGrace = routerCloseTimeout + 5*time.Second

// runProcesses is the kill demo's parent process: it returns the exit
// status, as run does.
func runProcesses(ctx context.Context, cfg Config, stdout, stderr io.Writer) int {
	sim := newSimulation(cfg, stdout, stderr)
	defer sim.close(ctx) // after the processes are gone: they use what it closes
	if err := sim.setUpProcesses(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "router_example: %s\n", interruption(err))
			return exitBroken
		}
		fmt.Fprintf(stderr, "router_example: %v\n", err)
		return exitConfig
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "router_example: -processes starts this binary again, and cannot find it: %v\n", err)
		return exitConfig
	}
	sup := newSupervisor(cfg, sim, exe, stderr)
	defer sup.stop() // on every way out: no process outlives this one
	code := sup.run(ctx)
	sup.stop() // before the summary: every process reaped
	sim.res.processes = sup.result()
	ok := sim.report(ctx)
	switch {
	case code != exitOK:
		return code
	case ok:
		return exitOK
	}
	return exitBroken
}

// setUpProcesses is setUp for the kill demo's parent: the retention
// check, the store, the broker, the ledger and the plan; no router.
func (s *simulation) setUpProcesses(ctx context.Context) error {
	cfg := s.cfg
	if err := dedup.CheckHorizon(cfg.Retention, cfg.redeliveryHorizon().d); err != nil {
		err = retentionAdvice(cfg, err)
		if cfg.StrictRetention {
			return fmt.Errorf("%w (-strict-retention)", err)
		}
		s.warn(err.Error() + "; -strict-retention makes this an error")
	}
	st, err := openStore(ctx, cfg, s.runID, s.logger, &s.closers, &s.removers)
	if err != nil {
		return fmt.Errorf("store %s: %w", cfg.Store, err)
	}
	b, err := openBroker(ctx, cfg, s.runID, s.logger, &s.closers, &s.removers)
	if err != nil {
		return fmt.Errorf("broker %s: %w", cfg.Broker, err)
	}
	if _, err := s.start(ctx, b, st); err != nil {
		return fmt.Errorf("store %s: %w", cfg.Store, err)
	}
	b.drained = kafkaDrained(b.kafka, b.topic, b.group)
	return nil
}

// kafkaDrained reports whether group has committed, on every partition
// of topic, the offset after its last message.
func kafkaDrained(brokers []string, topic, group string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		return awaitWithin(ctx, 5*time.Second, "reading the consumer group's offsets", func() (bool, error) {
			client, err := sarama.NewClient(brokers, kafkaConsumerConfig())
			if err != nil {
				return false, err
			}
			admin, err := sarama.NewClusterAdminFromClient(client) // closes client
			if err != nil {
				_ = client.Close()
				return false, err
			}
			defer admin.Close()
			parts, err := client.Partitions(topic)
			if err != nil {
				return false, err
			}
			offs, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
			if err != nil {
				return false, err
			}
			for _, p := range parts {
				end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					return false, err
				}
				if b := offs.GetBlock(topic, p); end > 0 && (b == nil || b.Offset < end) {
					return false, nil
				}
			}
			return true, nil
		}, nil)
	}
}

// consumerProc is a consumer process: p1, p2, ... in the order started.
type consumerProc struct {
	n       int
	pid     int
	cmd     *exec.Cmd
	out     *prefixWriter
	started time.Time

	// Under supervisor.mu.
	ready    bool // its router runs
	inFlight int  // deliveries received and not done
	killed   bool // SIGKILLed by the demo
	stopping bool // SIGTERMed at the end
	exitErr  error

	exited chan struct{} // closed once reaped and its reports read
}

// delivery is one delivery of a message to a consumer process.
type delivery struct {
	proc          int
	at            time.Time
	ran, done, ok bool
}

// messageHistory is every delivery of one message, in the order reported.
type messageHistory struct {
	event, payment string
	deliveries     []*delivery
}

// killRecord is one SIGKILL.
type killRecord struct {
	proc, pid int
	at        time.Time
	inFlight  int
}

// supervisor starts, kills and stops the consumer processes, and reads
// their reports into the simulation.
type supervisor struct {
	cfg    Config
	sim    *simulation
	exe    string
	args   []string // every consumer process's flags but -consumer-process
	env    []string
	stderr *lockedWriter

	spawn   *spawner
	changed chan struct{} // a process became ready or exited (capacity 1)

	mu      sync.Mutex
	procs   []*consumerProc
	history map[string]*messageHistory // by messageRef
	kills   []killRecord
	badLine error // the first report that did not parse
	begun   time.Time
	stopped bool
}

func newSupervisor(cfg Config, sim *simulation, exe string, stderr io.Writer) *supervisor {
	return &supervisor{
		cfg: cfg, sim: sim, exe: exe,
		args:    consumerArgs(cfg, sim),
		env:     consumerEnv(cfg),
		stderr:  &lockedWriter{w: stderr},
		spawn:   newSpawner(),
		changed: make(chan struct{}, 1),
		history: map[string]*messageHistory{},
	}
}

// consumerArgs are the flags of a consumer process: the run's broker
// (the in-process Kafka as -broker=kafka), store and run id, and the
// consumer's settings. Only flags its settings use: it must not warn.
func consumerArgs(cfg Config, sim *simulation) []string {
	session := cfg.KafkaSessionTimeout
	if session == 0 {
		session = kafkaSessionTimeout
		if cfg.Broker == brokerKafkaEmbedded {
			session = embeddedSessionTimeout
		}
	}
	f := strconv.FormatFloat
	args := []string{
		"-broker=" + brokerKafka,
		"-kafka-brokers=" + strings.Join(sim.broker.kafka, ","),
		"-kafka-session-timeout=" + session.String(),
		"-store=" + cfg.Store,
		"-run-id=" + sim.runID,
		"-producer=" + cfg.Producer,
		"-seed=" + strconv.FormatUint(cfg.Seed, 10),
		"-fail-rate=" + f(cfg.FailRate, 'g', -1, 64),
		"-lost-ack-rate=" + f(cfg.LostAckRate, 'g', -1, 64),
		"-crash-rate=" + f(cfg.CrashRate, 'g', -1, 64),
		"-concurrency=" + strconv.Itoa(cfg.Concurrency),
		"-dedup=" + strconv.FormatBool(cfg.Dedup),
		"-retention=" + cfg.Retention.String(),
		"-kafka-group-recovery=" + cfg.KafkaGroupRecovery.String(),
		"-redelivery-horizon=" + cfg.RedeliveryHorizon.String(),
		"-strict-retention=" + strconv.FormatBool(cfg.StrictRetention),
		"-v=" + strconv.FormatBool(cfg.Verbose),
	}
	if cfg.Store == storeSQLite {
		args = append(args, "-dir="+filepath.Dir(sim.store.path))
	}
	return args
}

// consumerEnv is this process's environment without any variable a flag
// reads (the flags given win over them anyway), but for the database's
// DSN, which stays out of the command line.
func consumerEnv(cfg Config) []string {
	var c Config
	fs := newFlagSet(&c, io.Discard)
	drop := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { drop[cliflag.EnvName(f.Name)] = true })
	drop[cliflag.EnvName("config")] = true
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !drop[name] {
			env = append(env, kv)
		}
	}
	switch cfg.Store {
	case storePostgres:
		env = append(env, cliflag.EnvName("postgres-dsn")+"="+cfg.PostgresDSN)
	case storeMySQL:
		env = append(env, cliflag.EnvName("mysql-dsn")+"="+cfg.MySQLDSN)
	}
	return env
}

// run starts the processes, publishes the plan, kills and replaces
// processes until every message was acked, -timeout passed or ctx ended,
// and waits for the group to commit its offsets. It returns exitOK, or
// the exit status of a run that could not go on.
func (s *supervisor) run(ctx context.Context) int {
	sim := s.sim
	deadline := time.NewTimer(s.cfg.Timeout)
	defer deadline.Stop()
	for range s.cfg.Processes {
		if _, err := s.start(); err != nil {
			sim.fail("starting a consumer process", err)
			return exitConfig
		}
	}
	if code := s.waitReady(ctx, deadline.C); code != exitOK {
		return code
	}
	sim.ran = true
	fmt.Fprintf(s.stderr, "router_example: run %s (seed %d): broker %s, store %s, mode %s%s; publishing %d messages of %d events\n",
		sim.runID, s.cfg.Seed, s.cfg.Broker, s.cfg.Store, modeText(s.cfg), producerNote(s.cfg), len(sim.plan.messages), sim.plan.events)
	kills := "no kills (-kill-every=0)"
	if s.cfg.KillEvery > 0 {
		kills = fmt.Sprintf("SIGKILL one every %s (-kill-every), the first once a quarter of the messages were handled if sooner", s.cfg.KillEvery)
	}
	fmt.Fprintf(s.stderr, "router_example: %d consumer processes (-processes) on %s and %s; %s\n",
		s.cfg.Processes, sim.broker.addr, sim.store.addr, kills)

	start := time.Now()
	s.mu.Lock()
	s.begun = start
	s.mu.Unlock()
	defer func() { sim.res.elapsed = time.Since(start) }()
	pctx, cancel := context.WithCancel(ctx)
	type published struct {
		failures int
		err      error
	}
	// With kills, half of the messages wait for the first: every run has
	// one while there is work left.
	msgs, firstKill := sim.plan.messages, make(chan struct{})
	half := len(msgs)
	if s.cfg.KillEvery > 0 {
		half = len(msgs) / 2
	}
	publishDone := make(chan published, 1)
	go func() {
		n, err := publishMessages(pctx, sim.broker.producer, sim.broker.topic, msgs[:half], sim.tracker)
		if err == nil && half < len(msgs) {
			select {
			case <-firstKill:
			case <-pctx.Done():
				publishDone <- published{n, pctx.Err()}
				return
			}
			var more int
			more, err = publishMessages(pctx, sim.broker.producer, sim.broker.topic, msgs[half:], sim.tracker)
			n += more
		}
		if err == nil {
			sim.tracker.producerDone()
		}
		publishDone <- published{n, err}
	}()
	defer func() {
		cancel()
		if publishDone != nil {
			sim.res.publishFailures = (<-publishDone).failures
		}
	}()

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	total := len(sim.plan.messages)
	nextKill := start.Add(s.cfg.KillEvery)
	ackedAtKill := 0
	for {
		select {
		case <-sim.tracker.done:
			sim.res.finished = true
			sim.waitDrained(ctx) // offsets committed: nothing comes again
			return exitOK
		case p := <-publishDone:
			publishDone = nil
			sim.res.publishFailures = p.failures
			if p.err != nil && ctx.Err() != nil { // a signal: not the publisher's fault
				sim.fail("run", errors.New("interrupted"))
				return exitBroken
			}
			if p.err != nil {
				sim.fail("publish", p.err)
				return exitBroken
			}
		case <-s.changed:
			if code := s.checkExits(); code != exitOK {
				return code
			}
		case <-tick.C:
			if s.cfg.KillEvery <= 0 {
				continue
			}
			acked := sim.tracker.ackedCount()
			s.mu.Lock()
			first := len(s.kills) == 0
			s.mu.Unlock()
			// A kill only after progress since the last: the group
			// always gets to consume between two.
			// The first once a quarter of the messages were handled (half
			// are published before it), if sooner than -kill-every.
			due := !time.Now().Before(nextKill) || (first && 4*acked >= total)
			if due && acked > ackedAtKill && acked < total {
				killed, err := s.killOne(ctx)
				if err != nil {
					sim.fail("killing a consumer process", err)
					return exitBroken
				}
				if !killed {
					continue // none runs its router yet: the next tick
				}
				if first {
					close(firstKill)
				}
				ackedAtKill, nextKill = acked, time.Now().Add(s.cfg.KillEvery)
			}
		case <-deadline.C:
			return exitBroken // the summary says INCOMPLETE
		case <-ctx.Done():
			sim.fail("run", errors.New("interrupted"))
			return exitBroken
		}
	}
}

// waitReady waits until every process started runs its router.
func (s *supervisor) waitReady(ctx context.Context, deadline <-chan time.Time) int {
	for {
		s.mu.Lock()
		ready := 0
		for _, p := range s.procs {
			if p.ready {
				ready++
			}
		}
		all := ready == len(s.procs)
		s.mu.Unlock()
		if all {
			return exitOK
		}
		if code := s.checkExits(); code != exitOK {
			return code
		}
		select {
		case <-s.changed:
		case <-deadline:
			s.sim.fail("run", fmt.Errorf("the consumer processes did not all start within -timeout %s", s.cfg.Timeout))
			return exitBroken
		case <-ctx.Done():
			s.sim.fail("run", errors.New("interrupted"))
			return exitBroken
		}
	}
}

// checkExits fails the run when a process exited that was neither
// killed nor stopped: exitConfig when it never ran its router and said
// so with status 2 (its error is on stderr), exitBroken otherwise.
func (s *supervisor) checkExits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		select {
		case <-p.exited:
		default:
			continue
		}
		if p.killed || p.stopping {
			continue
		}
		code := exitCode(p.exitErr)
		s.sim.fail(fmt.Sprintf("consumer process p%d (pid %d)", p.n, p.pid), fmt.Errorf("it exited by itself, %s", exitText(p.exitErr)))
		if !p.ready && code == exitConfig {
			return exitConfig
		}
		return exitBroken
	}
	return exitOK
}

// exitCode is a reaped process's exit status; -1 when a signal ended it.
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

func exitText(err error) string {
	if err == nil {
		return "with status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() >= 0 {
		return fmt.Sprintf("with status %d", ee.ExitCode())
	}
	return err.Error()
}

// start starts the next consumer process.
func (s *supervisor) start() (*consumerProc, error) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, errors.New("the run is ending")
	}
	n := len(s.procs) + 1
	s.mu.Unlock()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("a pipe for consumer process p%d: %w", n, err)
	}
	cmd := exec.Command(s.exe, append([]string{"-consumer-process=" + strconv.Itoa(n)}, s.args...)...)
	cmd.Env = s.env
	cmd.ExtraFiles = []*os.File{w} // reportFD
	out := &prefixWriter{w: s.stderr, prefix: fmt.Sprintf("[p%d] ", n)}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = consumerSysProcAttr()
	err = s.spawn.start(cmd)
	_ = w.Close() // the child has it
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("start consumer process p%d (%s): %w", n, s.exe, err)
	}
	p := &consumerProc{n: n, pid: cmd.Process.Pid, cmd: cmd, out: out, started: time.Now(), exited: make(chan struct{})}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	fmt.Fprintf(s.stderr, "router_example: started consumer process p%d (pid %d)\n", n, p.pid)

	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		s.read(p, r)
	}()
	go func() {
		err := cmd.Wait()
		<-readDone
		p.out.flush()
		s.mu.Lock()
		p.exitErr = err
		s.mu.Unlock()
		close(p.exited)
		s.notify()
	}()
	return p, nil
}

func (s *supervisor) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// read reads p's reports until its end of the pipe closes (it exited).
func (s *supervisor) read(p *consumerProc, r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		var rep report
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			s.mu.Lock()
			if s.badLine == nil {
				s.badLine = fmt.Errorf("consumer process p%d reported %q: %w", p.n, sc.Text(), err)
			}
			s.mu.Unlock()
			continue
		}
		s.handle(p, rep)
	}
	// A SIGKILLed process's pipe ends where it died, a line cut short
	// at most: that line is lost, as the process's work is.
}

// handle takes one report of p into the simulation and the histories.
func (s *supervisor) handle(p *consumerProc, rep report) {
	sim := s.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	last := func() *delivery { // p's delivery of rep.Ref in progress
		if h := s.history[rep.Ref]; h != nil {
			for i := len(h.deliveries) - 1; i >= 0; i-- {
				if d := h.deliveries[i]; d.proc == p.n {
					return d
				}
			}
		}
		return &delivery{} // reported without its recv: counted, not kept
	}
	switch rep.Kind {
	case reportReady:
		p.ready = true
		s.notify()
	case reportRecv:
		h := s.history[rep.Ref]
		if h == nil {
			h = &messageHistory{event: rep.Event, payment: rep.Payment}
			s.history[rep.Ref] = h
		}
		h.deliveries = append(h.deliveries, &delivery{proc: p.n, at: time.Unix(0, rep.At)})
		p.inFlight++
		sim.tracker.deliver(rep.Ref)
	case reportRan:
		last().ran = true
		sim.handlerRuns.Add(1)
	case reportDone:
		d := last()
		d.done, d.ok = true, rep.OK
		p.inFlight--
		if !rep.OK {
			sim.tracker.nack(rep.Nack)
			break
		}
		if rep.Poisoned {
			sim.tracker.poison()
		}
		sim.tracker.ack(rep.Ref)
	case reportCall:
		sim.calls.Add(1)
	case reportAttempt:
		sim.attempts.Add(1)
	case reportOutcome:
		sim.counts.Observe(handlerName, dedup.Outcome(rep.Outcome))
	case reportFault:
		sim.faults.add(rep.Fault)
	}
}

// killOne SIGKILLs the ready process with the most messages in flight
// (the oldest of those), waits until it is reaped, and starts a
// replacement. It reports whether it killed one.
func (s *supervisor) killOne(ctx context.Context) (bool, error) {
	s.mu.Lock()
	var victim *consumerProc
	for _, p := range s.procs {
		if !p.ready || p.killed || p.stopping || isClosed(p.exited) {
			continue
		}
		if victim == nil || p.inFlight > victim.inFlight {
			victim = p
		}
	}
	if victim == nil {
		s.mu.Unlock()
		return false, nil
	}
	victim.killed = true
	inFlight := victim.inFlight
	s.mu.Unlock()
	if err := signalGroup(victim.pid, sigKill); err != nil && !isClosed(victim.exited) {
		return false, fmt.Errorf("SIGKILL consumer process p%d (pid %d): %w", victim.n, victim.pid, err)
	}
	select {
	case <-victim.exited:
	case <-ctx.Done():
		return false, nil // the run ends: stop reaps it
	}
	at := time.Now()
	s.mu.Lock()
	s.kills = append(s.kills, killRecord{proc: victim.n, pid: victim.pid, at: at, inFlight: inFlight})
	n := len(s.procs) + 1
	elapsed := at.Sub(s.begun).Seconds()
	s.mu.Unlock()
	fmt.Fprintf(s.stderr, "router_example: SIGKILLed consumer process p%d (pid %d) at %.1fs, messages in flight: %d; starting p%d\n",
		victim.n, victim.pid, elapsed, inFlight, n)
	_, err := s.start()
	return true, err
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stop ends every process still running: SIGTERM, then SIGKILL after
// stopGrace, and waits until each is reaped. A process that ran its
// router and does not stop cleanly fails the run. It runs once; the
// spawner's thread goes after the last process.
func (s *supervisor) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	var live []*consumerProc
	for _, p := range s.procs {
		if !isClosed(p.exited) {
			p.stopping = true
			live = append(live, p)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = signalGroup(p.pid, sigTerm)
			t := time.NewTimer(stopGrace)
			defer t.Stop()
			select {
			case <-p.exited:
			case <-t.C:
				fmt.Fprintf(s.stderr, "router_example: consumer process p%d (pid %d) did not stop within %s of SIGTERM: SIGKILL\n", p.n, p.pid, stopGrace)
				_ = signalGroup(p.pid, sigKill)
				<-p.exited
			}
		}()
	}
	wg.Wait()
	s.spawn.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range live {
		if p.ready && p.exitErr != nil && !p.killed {
			s.sim.fail(fmt.Sprintf("consumer process p%d (pid %d)", p.n, p.pid), fmt.Errorf("it did not stop cleanly on SIGTERM, %s", exitText(p.exitErr)))
		}
	}
	if s.badLine != nil {
		s.sim.fail("reports", s.badLine)
	}
}

// spawner starts the consumer processes from one goroutine locked to its
// OS thread: Linux sends a child its parent-death signal when the
// *thread* that started it ends, and the Go runtime may end an idle
// thread. The thread ends once every process was reaped (close).
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func newSpawner() *spawner {
	sp := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for r := range sp.reqs {
			r.err <- r.cmd.Start()
		}
	}()
	return sp
}

func (sp *spawner) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	sp.reqs <- spawnReq{cmd, errc}
	return <-errc
}

func (sp *spawner) close() { close(sp.reqs) }

// lockedWriter writes whole lines from several processes' copies at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// prefixWriter writes a consumer process's output a line at a time, each
// after prefix. exec.Cmd calls Write from one goroutine.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := slices.Index(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := append([]byte(p.prefix), p.buf[:i+1]...)
		p.buf = p.buf[i+1:]
		if _, err := p.w.Write(line); err != nil {
			return len(b), err
		}
	}
}

// flush writes a last line without its newline.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		_, _ = p.w.Write(append([]byte(p.prefix), append(p.buf, '\n')...))
		p.buf = nil
	}
}

// processesResult is what the kill demo did, for the summary.
type processesResult struct {
	processes int // at a time
	started   int
	killEvery time.Duration
	kills     []killResult
}

// killResult is one kill and the messages of the killed process that
// other processes received after it.
type killResult struct {
	killRecord
	elapsed     time.Duration
	redelivered []redelivery
}

// redelivery is a message the killed process had received and another
// received after the kill.
type redelivery struct {
	ref, event, payment string
	state               int  // in the killed process: stateInFlight, stateAcked, stateNacked
	to                  int  // the process that received it first after the kill
	handled             bool // its handler ran again (else: dropped as a duplicate)
}

func (s *supervisor) result() *processesResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := &processesResult{processes: s.cfg.Processes, started: len(s.procs), killEvery: s.cfg.KillEvery}
	refs := make([]string, 0, len(s.history))
	for ref := range s.history {
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool {
		a, b := s.history[refs[i]], s.history[refs[j]]
		if a.event != b.event {
			return a.event < b.event
		}
		return refs[i] < refs[j]
	})
	for _, k := range s.kills {
		kr := killResult{killRecord: k, elapsed: k.at.Sub(s.begun)}
		for _, ref := range refs {
			if r, ok := redeliveredAfter(s.history[ref], k); ok {
				r.ref = ref
				kr.redelivered = append(kr.redelivered, r)
			}
		}
		// In flight first: the messages the kill cut short.
		sort.SliceStable(kr.redelivered, func(i, j int) bool { return kr.redelivered[i].state < kr.redelivered[j].state })
		res.kills = append(res.kills, kr)
	}
	return res
}

// redeliveredAfter says whether h's message was received by the process
// killed in k and by another after k, and what became of it.
func redeliveredAfter(h *messageHistory, k killRecord) (redelivery, bool) {
	var mine, after *delivery
	var handled bool
	for _, d := range h.deliveries {
		switch {
		case d.proc == k.proc:
			mine = d
		case mine != nil && d.at.After(k.at):
			if after == nil {
				after = d
			}
			handled = handled || d.ran
		}
	}
	if mine == nil || after == nil {
		return redelivery{}, false
	}
	state := stateAcked
	switch {
	case !mine.done:
		state = stateInFlight
	case !mine.ok:
		state = stateNacked
	}
	return redelivery{event: h.event, payment: h.payment, state: state, to: after.proc, handled: handled}, true
}

// What a killed process had done with a message it received.
const (
	stateInFlight = iota // not done: its transaction died with the process
	stateAcked           // acked, but its offset not yet committed
	stateNacked          // failed: it was coming again anyway
)

var stateText = [...]string{
	stateInFlight: "in flight",
	stateAcked:    "acked, offset not committed",
	stateNacked:   "nacked",
}

// killListed is how many redelivered messages the summary lists a kill
// (-v: all).
const killListed = 8

func (r *processesResult) print(w io.Writer, res *result) {
	fmt.Fprintf(w, "  %-28s %9d  %d at a time; %d SIGKILLed (-kill-every %s) and replaced\n",
		"consumer processes", r.started, r.processes, len(r.kills), r.killEvery)
	var n [3]struct{ all, handled int } // by state
	for _, k := range r.kills {
		for _, d := range k.redelivered {
			n[d.state].all++
			if d.handled {
				n[d.state].handled++
			}
		}
	}
	total := n[0].all + n[1].all + n[2].all
	note := fmt.Sprintf("of the killed processes' messages, received again by another: %d in flight at the kill (%d handled again), "+
		"%d acked before it, offset not yet committed (%d dropped as duplicates)",
		n[stateInFlight].all, n[stateInFlight].handled, n[stateAcked].all, n[stateAcked].all-n[stateAcked].handled)
	if n[stateNacked].all > 0 {
		note += fmt.Sprintf(", %d nacked before it", n[stateNacked].all)
	}
	fmt.Fprintf(w, "  %-28s %9d  %s\n", "redelivered after kills", total, note)
	for _, k := range r.kills {
		fmt.Fprintf(w, "    p%d (pid %d) SIGKILLed at %.1fs with %d in flight; %d of its messages redelivered\n",
			k.proc, k.pid, k.elapsed.Seconds(), k.inFlight, len(k.redelivered))
		for i, d := range k.redelivered {
			if i == killListed && !res.cfg.Verbose {
				fmt.Fprintf(w, "      ... %d more (-v lists them all)\n", len(k.redelivered)-i)
				break
			}
			then := "dropped as a duplicate"
			if d.handled {
				then = "handled again"
			}
			awarded := ""
			if res.ledgerErr == nil {
				awarded = fmt.Sprintf(", %s awarded %s", d.payment, times(res.ledger.PerPayment[d.payment]))
			}
			fmt.Fprintf(w, "      %-10s %-29s -> p%d: %s%s\n", d.event, stateText[d.state], d.to, then, awarded)
		}
	}
}

func times(n int64) string {
	switch n {
	case 0:
		return "never"
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}
