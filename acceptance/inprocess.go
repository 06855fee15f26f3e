package acceptance

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// consumer is a router in the test process.
type consumer struct {
	r      *run
	spec   consumerSpec
	core   *consumerCore
	sub    message.Subscriber
	router *message.Router

	mu   sync.Mutex
	proc *proc

	stopped  chan struct{}
	stopOnce sync.Once
	torn     sync.Once

	// closing is closed when the router first closes the subscriber, as
	// it begins to close (conn.watchClose); nil otherwise.
	closing chan struct{}
}

// noClose keeps a shared publisher open when a router closes its handler's
// publisher.
type noClose struct{ message.Publisher }

func (noClose) Close() error { return nil }

// conn is what a consumer connects with.
type conn struct {
	benv   Env
	opened Opened
	// hook takes over the effect of some deliveries (see handlerHook).
	hook handlerHook
	// watchClose: report when the router begins to close (consumer.closing).
	watchClose bool
}

// startConsumer starts an in-process consumer on the run's backend and
// store.
func (r *run) startConsumer(spec consumerSpec) *consumer {
	r.t.Helper()
	return r.startConsumerWith(spec, conn{benv: r.benv, opened: r.opened})
}

// startConsumerWith starts an in-process consumer on cn.
func (r *run) startConsumerWith(spec consumerSpec, cn conn) *consumer {
	r.t.Helper()
	c := &consumer{r: r, spec: spec, proc: newProc(), stopped: make(chan struct{})}
	sink := &inprocSink{run: r, c: c}
	c.core = newConsumerCore(spec, sink, cn.opened, r.b, r.s, r.logger)
	c.core.currentProc = c.currentProc
	c.core.nackOnDeath = !r.b.Features.Persistent
	c.core.dead = r.done
	c.core.hook = cn.hook
	r.used(spec.Topic, spec.Group)
	sub, err := newSubscriber(r.t, r.b, cn.benv, spec)
	if err != nil {
		r.t.Fatalf("backend %s subscriber: %v", r.b.Name, err)
	}
	if cn.watchClose {
		w := &closeWatch{Subscriber: sub, closing: make(chan struct{})}
		c.closing, sub = w.closing, w
	}
	c.sub = sub
	router, err := c.core.router(sub, noClose{r.pub})
	if err != nil {
		r.t.Fatalf("consumer %s: %v", spec.Name, err)
	}
	c.router = router
	go func() {
		defer close(c.stopped)
		if err := router.Run(context.Background()); err != nil && !r.ended() {
			r.t.Errorf("consumer %s: router: %v", spec.Name, err)
		}
	}()
	r.t.Cleanup(c.stop)
	r.addStopper(c.stop)
	select {
	case <-router.Running():
	case <-c.stopped:
		r.t.Fatalf("consumer %s: router stopped before running", spec.Name)
	case <-time.After(time.Minute):
		r.t.Fatalf("consumer %s: router not running after a minute", spec.Name)
	}
	return c
}

func (c *consumer) currentProc() *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// stop ends the consumer: its hung and dead handlers return first. Under
// AsyncComplete it then closes the middleware, once the router stopped.
func (c *consumer) stop() {
	c.stopOnce.Do(func() {
		c.r.finish()
		if err := c.router.Close(); err != nil {
			c.r.t.Logf("consumer %s: closing the router: %v", c.spec.Name, err)
		}
		select {
		case <-c.stopped:
		case <-time.After(time.Minute):
			c.r.t.Errorf("consumer %s: router still running a minute after Close", c.spec.Name)
		}
		if err := c.core.closeMiddleware(c.currentProc()); err != nil {
			c.r.t.Errorf("consumer %s: closing the middleware: %v", c.spec.Name, err)
		}
		if err := c.sub.Close(); err != nil {
			c.r.t.Logf("consumer %s: closing the subscriber: %v", c.spec.Name, err)
		}
	})
}

// shutdown closes the consumer as a deploy does, with its handlers
// running: router.Close, then, once the router began closing (it closed
// the subscriber: the consumer must have been started with
// conn.watchClose), release, which lets the held handlers go on. It waits for the router to stop, closes the middleware
// (under AsyncComplete its Completes land first) and the subscriber.
// Unlike stop it does not end the scenario: another consumer of the group
// resumes. It returns router.Close's error (a handler outlived the
// router's CloseTimeout).
func (c *consumer) shutdown(release func()) error {
	var closeErr error
	c.stopOnce.Do(func() {
		if c.closing == nil {
			c.r.t.Fatalf("consumer %s: shutdown needs conn.watchClose", c.spec.Name)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.router.Close() }()
		select {
		case <-c.closing:
		case <-c.stopped:
		case <-time.After(time.Minute):
			c.r.t.Errorf("consumer %s: the router did not close its subscriber a minute after Close", c.spec.Name)
		}
		release()
		select {
		case closeErr = <-closed:
		case <-time.After(2 * time.Minute):
			c.r.t.Errorf("consumer %s: router.Close did not return within two minutes", c.spec.Name)
		}
		select {
		case <-c.stopped:
		case <-time.After(time.Minute):
			c.r.t.Errorf("consumer %s: router still running a minute after Close", c.spec.Name)
		}
		if err := c.core.closeMiddleware(c.currentProc()); err != nil {
			c.r.t.Errorf("consumer %s: closing the middleware: %v", c.spec.Name, err)
		}
		if err := c.sub.Close(); err != nil {
			c.r.t.Logf("consumer %s: closing the subscriber: %v", c.spec.Name, err)
		}
	})
	return closeErr
}

// closeWatch reports when its subscriber is first closed.
type closeWatch struct {
	message.Subscriber
	once    sync.Once
	closing chan struct{}
}

func (w *closeWatch) Close() error {
	w.once.Do(func() { close(w.closing) })
	return w.Subscriber.Close()
}

// regenerate kills the consumer's current proc and gives it a new one:
// the emulated crash and restart of a consumer that stays subscribed.
func (c *consumer) regenerate() int {
	c.mu.Lock()
	old := c.proc
	c.proc = newProc()
	c.mu.Unlock()
	return c.kill(old)
}

// kill kills p and forgets its deliveries in flight: a dead process
// handles nothing.
func (c *consumer) kill(p *proc) int {
	live, window := p.kill()
	for _, d := range live {
		c.r.handled(d, errCrashed)
	}
	return len(window)
}

// teardown kills the consumer and closes its subscriber without acking
// what it holds, so the broker redelivers it to the group.
func (c *consumer) teardown() int {
	window := c.kill(c.currentProc())
	c.torn.Do(func() {
		go func() {
			if err := c.sub.Close(); err != nil {
				c.r.t.Logf("consumer %s: closing the subscriber: %v", c.spec.Name, err)
			}
		}()
	})
	return window
}

// inprocSink is the sink of an in-process consumer.
type inprocSink struct {
	*run
	c *consumer
}

func (s *inprocSink) crash(d *delivery, point crashPoint) error {
	if !s.b.Features.Persistent {
		window := s.c.regenerate()
		s.logCrash(crashRecord{consumer: d.consumer, delivery: d.key(), event: d.event, point: point, window: window})
		return errCrashed
	}
	s.crashes <- crashNote{consumer: d.consumer, delivery: d.key(), event: d.event, point: point, kill: s.c.teardown}
	<-s.done
	return errCrashed
}
