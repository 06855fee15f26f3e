package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
)

// A consumer process of the kill demo (-processes, processes.go) is this
// binary started with -consumer-process=N: the router of main.go on the
// run's broker and store, consuming until SIGTERM (or SIGKILL). It
// publishes nothing and prints no summary: it reports every delivery, and
// what became of it, to its parent, a JSON object a line on file
// descriptor 3, written before the router acks the message, so that the
// parent knows what a process it killed had received and done.

// reportFD is the file descriptor a consumer process reports on: the
// parent's pipe, the first of exec.Cmd.ExtraFiles.
const reportFD = 3

// Kinds of report.
const (
	reportReady   = "ready"   // the router runs
	reportRecv    = "recv"    // a delivery starts
	reportRan     = "ran"     // the handler runs for it (the dedup middleware claimed it)
	reportDone    = "done"    // the delivery's handlers returned: OK means it is acked
	reportOutcome = "outcome" // the dedup middleware's outcome of a delivery
	reportFault   = "fault"   // a fault was injected
	reportCall    = "call"    // a delivery reaches the router's retry middleware
	reportAttempt = "attempt" // which runs the handlers once more
)

// report is one line a consumer process reports.
type report struct {
	Kind     string `json:"k"`
	Ref      string `json:"ref,omitempty"` // messageRef
	Event    string `json:"ev,omitempty"`
	Payment  string `json:"pay,omitempty"`
	At       int64  `json:"at,omitempty"` // unix nanoseconds, of recv
	OK       bool   `json:"ok,omitempty"`
	Nack     string `json:"nack,omitempty"` // nackCause, of a done that is not OK
	Poisoned bool   `json:"poison,omitempty"`
	Outcome  int    `json:"o,omitempty"`
	Fault    string `json:"f,omitempty"`
}

// reporter writes a consumer process's reports. A write that fails (the
// parent is gone) closes failed: the process stops.
type reporter struct {
	mu     sync.Mutex
	w      io.Writer
	err    error
	failed chan struct{}
}

func newReporter(w io.Writer) *reporter {
	return &reporter{w: w, failed: make(chan struct{})}
}

func (r *reporter) send(rep report) {
	b, err := json.Marshal(rep)
	if err != nil {
		panic(err) // strings, ints and bools only
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return
	}
	// One write a line: the pipe keeps writes of up to PIPE_BUF bytes
	// whole, and the line is far shorter.
	if _, err := r.w.Write(append(b, '\n')); err != nil {
		r.err = fmt.Errorf("reporting to the parent process: %w", err)
		close(r.failed)
	}
}

// middleware is the outermost router middleware of a consumer process.
func (r *reporter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ref := messageRef(msg)
		var ev paymentCompleted
		_ = json.Unmarshal(msg.Payload, &ev) // a bad event reports no ids
		r.send(report{Kind: reportRecv, Ref: ref, Event: ev.EventID, Payment: ev.PaymentID, At: time.Now().UnixNano()})
		out, err := h(msg)
		done := report{Kind: reportDone, Ref: ref, OK: err == nil, Poisoned: err == nil && poisoned(msg)}
		if err != nil {
			done.Nack = nackCause(err)
		}
		r.send(done)
		return out, err
	}
}

func (r *reporter) ran(msg *message.Message) { r.send(report{Kind: reportRan, Ref: messageRef(msg)}) }

func (r *reporter) outcome(o dedup.Outcome) { r.send(report{Kind: reportOutcome, Outcome: int(o)}) }

func (r *reporter) fault(kind string) { r.send(report{Kind: reportFault, Fault: kind}) }

// errNotAConsumerProcess: -consumer-process without the parent's pipe.
var errNotAConsumerProcess = errors.New("-consumer-process is set by -processes on the processes it starts, with a pipe on file descriptor 3; run -processes instead")

// runConsumerProcess is the router of main.go as a consumer process of
// -processes: it reports to the parent on reportFD.
func runConsumerProcess(ctx context.Context, cfg Config, stdout, stderr io.Writer) int {
	f := os.NewFile(reportFD, "report pipe")
	if f == nil {
		fmt.Fprintf(stderr, "router_example: %v\n", errNotAConsumerProcess)
		return exitConfig
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		fmt.Fprintf(stderr, "router_example: %v\n", errNotAConsumerProcess)
		return exitConfig
	}
	defer f.Close()
	sim := newSimulation(cfg, stdout, stderr)
	sim.child = newReporter(f)
	return runRouter(ctx, cfg, sim, stderr)
}

// driveConsumer is drive for a consumer process: it says when the router
// runs, then waits for SIGTERM (ctx), or for the router or the reports
// to fail.
func (s *simulation) driveConsumer(ctx context.Context, running, stopped <-chan struct{}) {
	select {
	case <-running:
		s.ran = true
		s.child.send(report{Kind: reportReady})
	case <-stopped:
		s.fail("router", errors.New("it stopped before it ran"))
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-ctx.Done(): // the parent stops it
	case <-stopped:
		s.fail("router", errors.New("it stopped"))
	case <-s.child.failed:
		s.child.mu.Lock()
		s.fail("consumer process", s.child.err)
		s.child.mu.Unlock()
	}
}

// reportConsumer is report for a consumer process: its parent checks the
// ledger and prints the summary; it says only what failed.
func (s *simulation) reportConsumer() bool {
	if s.res.runErr != nil {
		fmt.Fprintf(s.stderr, "router_example: consumer process %d: %v\n", s.cfg.ConsumerProcess, s.res.runErr)
		return false
	}
	return true
}
