package expiringkeys

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/stores"
)

// Default values of Config fields.
const (
	// DefaultWindow is the window of the repository Watermill's
	// Deduplicator makes when it is given none: switching to this
	// package changes where keys are kept, not for how long.
	DefaultWindow = time.Minute
	// DefaultLease is dedup.DefaultLease.
	DefaultLease = dedup.DefaultLease
)

// ReleaseTimeout bounds the release of a key whose mark failed, when the
// context of the call has ended (see Repository.IsDuplicate), or Lease if
// shorter.
const ReleaseTimeout = dedup.DefaultStoreTimeout

// InProgressPoll is how often, give or take half of it (a random spread),
// IsDuplicate claims a key held by another caller again while it waits
// for it (Config.InProgressWait).
const InProgressPoll = dedup.DefaultInProgressPoll

// Config configures a Repository. The zero value of every field but Scope
// means its documented default.
type Config struct {
	// Scope keeps these keys apart from every other user of the store:
	// a key is seen only by the Repositories of the same Scope, on the
	// same store. Required. Give each Deduplicator a Scope of its own (a
	// handler's name, a topic): a consumer's Deduplicator sharing a
	// Scope and a KeyFactory with the producer's would drop every message
	// the producer published, whose key the producer marked.
	Scope string

	// Window is how long a key counts as seen after the IsDuplicate that
	// marked it: the retention of its record in the store, to the store's
	// precision (Watermill's in-memory repository keeps a key up to 50%
	// longer). A key checked after the Window is marked anew. The default
	// is DefaultWindow (one minute). New refuses a Window longer than the
	// store's MaxRetention.
	Window time.Duration

	// Lease bounds how long a key is held between the two store calls
	// that mark it: a Claim under Lease, then a Complete that records it
	// seen for Window. A caller that dies between the two leaves the key
	// held for Lease (see InProgressWait); a caller slower than Lease may
	// have its claim taken over by another caller, and then returns an
	// error wrapping stores.ErrLostClaim. The default is DefaultLease
	// (30s). New refuses a Lease longer than the store's MaxLease.
	Lease time.Duration

	// InProgressWait is how long IsDuplicate waits for a key another
	// caller holds (a claim in progress) to be settled, claiming it again
	// every InProgressPoll. When that caller marks the key, it is seen
	// (true); when the caller gives it back, or leaves it held until its
	// lease runs out, this call marks it (false). A key is left held by a
	// caller that died between its two store calls, and by a Claim that
	// failed with an error but reached the store all the same (its
	// context ended while it was under way): without the wait, the
	// redelivery of that caller's message would be dropped. A key still
	// held after InProgressWait counts as seen (true); when ctx ends
	// first, IsDuplicate returns an error wrapping dedup.ErrInProgress.
	// The default is Lease, the longest a key stays held; a negative
	// value counts a held key as seen at once.
	InProgressWait time.Duration

	// Logger receives a line for every key counted as seen without its
	// mark being found (held by another caller past InProgressWait: the
	// Deduplicator drops its message), for every takeover of a key whose
	// claim's lease ran out (its caller may get false for the key too),
	// and for a mark whose answer was lost. Errors are returned, not logged: the router logs them. The
	// default is dedup.DefaultLogger() (log/slog's default logger);
	// pass watermill.NopLogger{} to discard.
	Logger watermill.LoggerAdapter

	// Metrics receives the outcome of every IsDuplicate, by Scope
	// (dedup.OutcomeClaimed: marked now; OutcomeDuplicate: seen;
	// OutcomeInProgress: held past InProgressWait, counted as seen;
	// OutcomeStoreError, OutcomeLostClaim, OutcomeNoKey, OutcomeCancelled;
	// and OutcomeTakeover as well as the call's own outcome when it took
	// over a key whose claim's lease ran out),
	// and the latency of every store call: what the prommetrics and
	// otelmetrics packages export for the middleware. The default
	// discards them.
	Metrics dedup.Metrics
}

// Validate reports the first invalid field, naming it. Its errors wrap
// dedup.ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Scope == "":
		return fmt.Errorf("%w: expiringkeys: Scope is required (a name of this Deduplicator's own, such as its handler's)", dedup.ErrInvalidConfig)
	case c.Window < 0:
		return fmt.Errorf("%w: expiringkeys: Window must not be negative, got %s", dedup.ErrInvalidConfig, c.Window)
	case c.Lease < 0:
		return fmt.Errorf("%w: expiringkeys: Lease must not be negative, got %s", dedup.ErrInvalidConfig, c.Lease)
	}
	return nil
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.InProgressWait == 0 {
		c.InProgressWait = c.Lease
	}
	if c.Logger == nil {
		c.Logger = dedup.DefaultLogger()
	}
	if c.Metrics == nil {
		c.Metrics = dedup.NopMetrics{}
	}
	return c
}

// Repository is a Watermill ExpiringKeyRepository (of the
// message/router/middleware package) that keeps its keys in a dedup
// store. It is safe for concurrent use, by many goroutines and by many
// processes sharing the store. It starts no goroutine and needs no
// Close; the store is the caller's to close.
type Repository struct {
	store stores.Store
	cfg   Config
	caps  stores.Capabilities
	kind  string
}

var _ wmw.ExpiringKeyRepository = (*Repository)(nil)

// New returns a Repository keeping keys in store under cfg, or an error
// wrapping dedup.ErrInvalidConfig: a nil store, the error of
// cfg.Validate, or a setting the store cannot honour (a Window, Lease or
// Scope beyond its stores.Capabilities), naming the value and the
// store's bound.
func New(store stores.Store, cfg Config) (*Repository, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: expiringkeys: a store is required", dedup.ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	caps := store.Capabilities()
	kind := caps.Kind
	if kind == "" {
		kind = fmt.Sprintf("%T", store)
	}
	const lower = "lower it, or raise the store's bound"
	for _, c := range []struct {
		setting, hint string
		err           error
	}{
		{"Window", lower, stores.CheckBound("window", cfg.Window, caps.MaxRetention, kind+"'s MaxRetention")},
		{"Lease", lower, stores.CheckBound("lease", cfg.Lease, caps.MaxLease, kind+"'s MaxLease")},
		{"Scope", "use a shorter Scope", stores.CheckBound("scope", len(cfg.Scope), caps.MaxScope, kind+"'s MaxScope")},
	} {
		if c.err != nil {
			return nil, fmt.Errorf("%w: expiringkeys: %s: %w; %s", dedup.ErrInvalidConfig, c.setting, c.err, c.hint)
		}
	}
	return &Repository{store: store, cfg: cfg, caps: caps, kind: kind}, nil
}

// Config returns the Repository's configuration, with its defaults.
func (r *Repository) Config() Config { return r.cfg }

// IsDuplicate reports whether key was seen within the Window, and marks
// it seen when it was not: the first call for a key returns false, every
// later one within the Window true, whichever process makes it. A call
// racing with the one that marks the key waits for it (see
// Config.InProgressWait) and returns true: the key is seen. One caller
// gets false for a key and a Window (two only when a caller's calls
// outlast Lease, see below).
//
// A key is marked in two store calls, both bounded by ctx: a Claim, and
// a Complete that records the key for Window. A failed store call
// returns false and an error wrapping dedup.ErrStore and the store's
// error (stores.ErrUnavailable for an outage, ctx's error, ...): never a
// silent "not a duplicate". When the Complete fails the claim is
// released, so that a retry can mark the key (under ctx, or for up to
// ReleaseTimeout once ctx has ended); when the release fails too the key
// stays held until Lease runs out. When the release finds the claim
// gone, the Complete landed and only its answer was lost: the key is
// marked and IsDuplicate returns false with no error. A Complete whose
// claim another caller took over (this one's calls outlasted Lease)
// returns an error wrapping stores.ErrLostClaim.
//
// An empty key, or one longer than the store keeps (its MaxKey), returns
// an error wrapping stores.ErrInvalidKey before the store is called; no
// retry will help it.
func (r *Repository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	seen, o, err := r.isDuplicate(ctx, key)
	r.cfg.Metrics.Observe(r.cfg.Scope, o)
	return seen, err
}

// isDuplicate is IsDuplicate, with the outcome it reports to Metrics.
func (r *Repository) isDuplicate(ctx context.Context, key string) (bool, dedup.Outcome, error) {
	if err := r.checkKey(key); err != nil {
		return false, dedup.OutcomeNoKey, err
	}
	keys := []string{key}
	var (
		deadline time.Time // of the wait for a claim in progress
		started  = time.Now()
	)
	for {
		c, err := r.claim(ctx, keys)
		if err != nil {
			return false, errOutcome(ctx, err), r.storeError("claim", err)
		}
		switch c.Result {
		case stores.Claimed:
			if c.Takeover {
				r.cfg.Metrics.Observe(r.cfg.Scope, dedup.OutcomeTakeover)
				r.cfg.Logger.Info("expiringkeys: took over a key whose claim's lease ran out: its caller died between its two store calls, or was slower than Lease, and may get false for the key too", watermill.LogFields{
					"scope": r.cfg.Scope, "key": key, "lease": r.cfg.Lease.String(),
				})
			}
			return r.mark(ctx, c, key)
		case stores.InProgress:
			if deadline.IsZero() {
				deadline = time.Now().Add(r.cfg.InProgressWait)
			}
			left := time.Until(deadline)
			if left <= 0 {
				r.cfg.Logger.Info("expiringkeys: key held by another caller past InProgressWait, counted as seen: the Deduplicator drops its message", watermill.LogFields{
					"scope": r.cfg.Scope, "key": key, "waited": time.Since(started).Round(time.Millisecond).String(), "lease": r.cfg.Lease.String(),
				})
				return true, dedup.OutcomeInProgress, nil
			}
			if err := sleep(ctx, min(left, spread(InProgressPoll))); err != nil {
				return false, dedup.OutcomeCancelled, fmt.Errorf("expiringkeys: scope %q: %w: %w", r.cfg.Scope, dedup.ErrInProgress, err)
			}
		default: // Duplicate
			return true, dedup.OutcomeDuplicate, nil
		}
	}
}

// errOutcome is the outcome of a store call that failed with err under
// ctx: a key the store refused, a lost claim, cancelled when ctx ended,
// else a store error.
func errOutcome(ctx context.Context, err error) dedup.Outcome {
	switch {
	case errors.Is(err, stores.ErrInvalidKey):
		return dedup.OutcomeNoKey
	case errors.Is(err, stores.ErrLostClaim):
		return dedup.OutcomeLostClaim
	case ctx.Err() != nil:
		return dedup.OutcomeCancelled
	}
	return dedup.OutcomeStoreError
}

// claim, complete and release call the store and report each call's
// latency and error to Metrics.
func (r *Repository) claim(ctx context.Context, keys []string) (*stores.Claim, error) {
	start := time.Now()
	c, err := r.store.Claim(ctx, r.cfg.Scope, keys, r.cfg.Lease)
	r.cfg.Metrics.ObserveStore(r.cfg.Scope, dedup.OpClaim, time.Since(start), err)
	return c, err
}

func (r *Repository) complete(ctx context.Context, c *stores.Claim) error {
	start := time.Now()
	err := r.store.Complete(ctx, c, r.cfg.Window, nil)
	r.cfg.Metrics.ObserveStore(r.cfg.Scope, dedup.OpComplete, time.Since(start), err)
	return err
}

func (r *Repository) releaseCall(ctx context.Context, c *stores.Claim) error {
	start := time.Now()
	err := r.store.Release(ctx, c)
	r.cfg.Metrics.ObserveStore(r.cfg.Scope, dedup.OpRelease, time.Since(start), err)
	return err
}

// mark records key, of claim c, seen for the Window.
func (r *Repository) mark(ctx context.Context, c *stores.Claim, key string) (bool, dedup.Outcome, error) {
	err := r.complete(ctx, c)
	if err == nil {
		return false, dedup.OutcomeClaimed, nil
	}
	if errors.Is(err, stores.ErrLostClaim) {
		return false, dedup.OutcomeLostClaim, r.storeError("complete", err)
	}
	released, rerr := r.release(ctx, c)
	if !released && rerr == nil {
		// The Complete landed, its answer lost: the key is marked.
		r.cfg.Logger.Debug("expiringkeys: a mark's answer was lost, and the release found it landed: the key is marked", watermill.LogFields{
			"scope": r.cfg.Scope, "key": key, "error": err.Error(),
		})
		return false, dedup.OutcomeClaimed, nil
	}
	return false, errOutcome(ctx, err), errors.Join(r.storeError("complete", err), rerr)
}

// spread returns d give or take half of it, at random.
func spread(d time.Duration) time.Duration {
	return d/2 + rand.N(d)
}

// sleep waits for d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkKey refuses what every store refuses, naming the Deduplicator's
// KeyFactory, which made the key.
func (r *Repository) checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("expiringkeys: scope %q: %w: the KeyFactory returned an empty key", r.cfg.Scope, stores.ErrInvalidKey)
	}
	if err := stores.CheckBound("key", len(key), r.caps.MaxKey, r.kind+"'s MaxKey"); err != nil {
		return fmt.Errorf("expiringkeys: scope %q: %w: %w; hash it (Watermill's NewMessageHasherSHA256)", r.cfg.Scope, stores.ErrInvalidKey, err)
	}
	return nil
}

// release gives back the claim of a key whose Complete failed, so that a
// retry can mark it. It reports whether it did; when the claim is no
// longer held (the Complete landed after all) it returns false and no
// error, and when the release failed, why the key stays held.
func (r *Repository) release(ctx context.Context, c *stores.Claim) (bool, error) {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), min(ReleaseTimeout, r.cfg.Lease))
		defer cancel()
	}
	switch err := r.releaseCall(ctx, c); {
	case err == nil:
		return true, nil
	case errors.Is(err, stores.ErrLostClaim):
		return false, nil
	default:
		return false, fmt.Errorf("expiringkeys: scope %q: the key stays held until its lease (%s) runs out: release: %w", r.cfg.Scope, r.cfg.Lease, err)
	}
}

func (r *Repository) storeError(call string, err error) error {
	return fmt.Errorf("expiringkeys: scope %q: %s: %w: %w", r.cfg.Scope, call, dedup.ErrStore, err)
}
