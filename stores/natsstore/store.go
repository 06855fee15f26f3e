package natsstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
)

// The Store: New and Connect, opening the buckets, Capabilities and
// Close. Its calls are in claim.go (Claim and the undo of what a failed
// call wrote) and fenced.go (Complete, Release, Extend); records.go reads
// and writes the bucket, conn.go follows the connection, errors.go
// classifies what fails.

// Internal bounds.
const (
	// maxClaimAttempts bounds how often a Claim starts again after a
	// concurrent writer changed one of its keys between its read and its
	// write; after that it reports InProgress (see Store.Claim).
	maxClaimAttempts = 8
	// undoTimeout bounds giving back what a failed call wrote.
	undoTimeout = 2 * time.Second
	// defaultRequestTimeout bounds a request made under a context
	// without a deadline, as the jetstream package does.
	defaultRequestTimeout = 5 * time.Second
)

// shard is one bucket.
type shard struct {
	bucket string
	stream jetstream.Stream
	prefix string // subject prefix of its keys
	// leaderReads sends reads to the stream's leader (the STREAM.MSG.GET
	// API) instead of direct gets, which any replica may answer: on a
	// replicated bucket, or one without direct gets.
	leaderReads bool
	msgGet      string // the leader API's subject
	// maxMsgSize is the stream's largest message (the bucket's
	// MaxValueSize), headers included; 0 or less when it has none.
	maxMsgSize int32
	// maxAge is the stream's MaxAge, 0 for none.
	maxAge time.Duration
}

// Store is the NATS JetStream KV store. Create it with New or Connect.
type Store struct {
	nc      *nats.Conn
	ownConn bool
	js      jetstream.JetStream
	cfg     Config
	clock   stores.Clock
	shards  []*shard
	// maxData is the most data a done record keeps (Capabilities): the
	// smaller of the server's maximum payload, as the connection reported
	// it when the store was built, and the buckets' largest message, less
	// the value's head and room for the message headers.
	maxData int
	// mode is how records expire (TTLBucket or TTLPerKey), and
	// maxRetention the longest retention Complete accepts in it.
	mode         TTLMode
	maxRetention time.Duration
	watch        *connWatch
	// violations are the permissions violations the server reported
	// that name the store's subjects (perms.go).
	violations *violationWatch

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// Background undos of calls whose callers' contexts ended.
	bg        sync.WaitGroup
	bgMu      sync.Mutex
	bgStopped bool // set by Close: no new background undo
	bgCtx     context.Context
	bgCancel  context.CancelFunc

	// testAfterWrite, when set, runs after each successful write of a
	// multi-key call, with the index of the write (tests only).
	testAfterWrite func(op string, i int)
	// testBeforeDelete, when set, runs between Delete's read and its
	// write (tests only).
	testBeforeDelete func()

	// claimLocks serialise each claim's fenced calls (claimlock.go).
	claimLocks claimLocks
}

var _ stores.Store = (*Store)(nil)

// New returns a Store on nc, a connection the caller owns: the store
// never closes it (close it yourself after closing the store). New opens
// the buckets (creating those that do not exist, see Config), picks how
// records expire (see TTLMode: per-key TTLs when the server and the
// existing buckets allow them, else the buckets' MaxAge), logs it to
// Config.Logger, and fails when NATS cannot be reached (an error
// wrapping stores.ErrUnavailable), when JetStream is not enabled, or
// when a bucket exists with a MaxAge shorter than the config needs, or
// without the per-message TTLs that TTLPerKey needs ([ErrBucketConfig]).
// ctx bounds that.
//
// The store follows the connection's status: while nats.go is
// reconnecting, calls fail at once instead of being buffered, and calls
// in flight when the connection drops fail so too instead of waiting for
// their deadline: with stores.ErrUnavailable when no server of the
// connection's pool can be reached (a dial refused or timed out, a
// server that accepts and does not speak), else with ErrRefused or
// ErrNotConnected (see connWatch). New wraps the connection's async
// error handler (nc.SetErrorHandler: the one set before still gets every
// error) to see the permissions violations the server reports on it,
// which a shared connection's own violations would hide from LastError.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if nc == nil {
		return nil, errors.New("natsstore: the NATS connection is nil")
	}
	return newStore(ctx, nc, false, cfg)
}

// Connect dials url with opts and returns a Store on that connection,
// which the store owns: Close closes it. See New.
func Connect(ctx context.Context, url string, cfg Config, opts ...nats.Option) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsstore: connect to %s: %w", url, classify(ctx, nil, err))
	}
	s, err := newStore(ctx, nc, true, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// Open returns a Store on nc for the buckets of cfg as they are, for a
// tool that reads and deletes records, such as dedupctl: unlike New, it
// creates no bucket (a missing one fails with an error wrapping
// [ErrNoBucket]) and accepts a bucket whatever its MaxAge, which New
// checks against cfg's MaxLease and MaxRetention. cfg's Bucket and Shards
// must be the consumers' (they decide where each record is), and its
// MaxLease the longest lease they give (Purge keeps the claims whose
// lease ended less than that ago). Its TTLMode is the buckets': TTLPerKey
// when every bucket allows per-message TTLs, whatever cfg.TTLMode says.
// Its Claim, Complete, Release and Extend work as New's, but on a bucket
// New would refuse its records may go before their time: claim through a
// store of New's.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if nc == nil {
		return nil, errors.New("natsstore: the NATS connection is nil")
	}
	cfg.asIs = true
	return newStore(ctx, nc, false, cfg)
}

func newStore(ctx context.Context, nc *nats.Conn, own bool, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsstore: %w", err)
	}
	s := &Store{nc: nc, ownConn: own, js: js, cfg: cfg, clock: cfg.Clock}
	buckets := cfg.Buckets()
	streams := make([]jetstream.Stream, len(buckets))
	for i, b := range buckets {
		st, err := s.js.Stream(ctx, streamName(b))
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound) && cfg.asIs:
			return nil, fmt.Errorf("%w: %q", ErrNoBucket, b)
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue // created below, in the mode picked
		case err != nil:
			return nil, fmt.Errorf("natsstore: open bucket %q: %w", b, s.classify(ctx, nil, err))
		}
		streams[i] = st
	}
	mode, why, err := s.pickMode(buckets, streams)
	if err != nil {
		return nil, err
	}
	s.mode = mode
	limit := nc.MaxPayload()
	s.maxRetention = cfg.MaxRetention
	if mode == TTLPerKey {
		s.maxRetention = MaxDurationLimit
	}
	for i, b := range buckets {
		sh, err := s.openBucket(ctx, b, streams[i])
		if err != nil {
			return nil, err
		}
		s.shards = append(s.shards, sh)
		if sh.maxMsgSize > 0 && (limit <= 0 || int64(sh.maxMsgSize) < limit) {
			limit = int64(sh.maxMsgSize)
		}
		if mode == TTLPerKey && sh.maxAge > 0 {
			// MaxAge removes a record with a TTL of its own as well.
			s.maxRetention = min(s.maxRetention, max(sh.maxAge-cfg.ClockSkew, time.Nanosecond))
		}
	}
	s.maxData = maxData(limit)
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	s.violations = watchViolations(nc, s.namesStoreSubject)
	s.watch = newConnWatch(nc)
	s.watch.violations = s.violations
	cfg.Logger.Info("natsstore: records expire by "+mode.String(), watermill.LogFields{
		"buckets": strings.Join(buckets, ","), "why": why, "server_version": nc.ConnectedServerVersion(),
		"max_lease": cfg.MaxLease, "max_retention": s.maxRetention,
	})
	return s, nil
}

// pickMode decides the store's TTLMode from the config, the server and
// the buckets that exist (streams, nil for a missing bucket), and says
// why.
func (s *Store) pickMode(buckets []string, streams []jetstream.Stream) (TTLMode, string, error) {
	_, level := s.nc.ConnectedServerJetStream()
	server := fmt.Sprintf("nats-server %s (JetStream API level %d)", s.nc.ConnectedServerVersion(), level)
	var without, missing []string
	for i, st := range streams {
		switch {
		case st == nil:
			missing = append(missing, buckets[i])
		case !st.CachedInfo().Config.AllowMsgTTL:
			without = append(without, buckets[i])
		}
	}
	if s.cfg.asIs {
		// The buckets decide: a tool must not write records or markers
		// without a TTL into a bucket that has no MaxAge.
		if len(without) > 0 {
			return TTLBucket, fmt.Sprintf("bucket %q has no per-message TTLs", without[0]), nil
		}
		return TTLPerKey, "every bucket has per-message TTLs", nil
	}
	switch s.cfg.TTLMode {
	case TTLBucket:
		return TTLBucket, "Config.TTLMode is TTLBucket", nil
	case TTLPerKey:
		if len(without) > 0 {
			return 0, "", fmt.Errorf("%w: TTLPerKey needs per-message TTLs, and bucket %q (stream %s) was created without them",
				ErrBucketConfig, without[0], streamName(without[0]))
		}
		if len(missing) > 0 && level < 1 {
			return 0, "", fmt.Errorf("%w: TTLPerKey needs per-message TTLs (nats-server 2.11 or later) to create bucket %q; %s has none",
				ErrBucketConfig, missing[0], server)
		}
		return TTLPerKey, "Config.TTLMode is TTLPerKey", nil
	}
	switch {
	case len(without) > 0:
		// Never change the expiry of an existing deployment: its records
		// have no TTL of their own, and its MaxAge is what removes them.
		return TTLBucket, fmt.Sprintf("bucket %q was created without per-message TTLs", without[0]), nil
	case len(missing) > 0 && level < 1:
		return TTLBucket, server + " has no per-message TTLs (2.11 or later)", nil
	case len(missing) > 0:
		return TTLPerKey, server + " has per-message TTLs", nil
	}
	return TTLPerKey, "every bucket has per-message TTLs", nil
}

// markerTTL is how long a purge marker (Release, Delete, Purge) stays
// under TTLPerKey, and the buckets' LimitMarkerTTL: how long the marker
// the server leaves in place of a record whose TTL ran out stays.
const markerTTL = time.Minute

// openBucket opens bucket (st; nil: create it, in the store's mode) and
// checks its MaxAge.
func (s *Store) openBucket(ctx context.Context, bucket string, st jetstream.Stream) (*shard, error) {
	need := s.cfg.RequiredMaxAge()
	if s.mode == TTLPerKey {
		// MaxAge, if the bucket has one, removes a record however
		// long its TTL: a processing record must last two leases.
		need = 2*s.cfg.MaxLease + s.cfg.ClockSkew
	}
	fail := func(what string, err error) (*shard, error) {
		return nil, fmt.Errorf("natsstore: %s bucket %q: %w", what, bucket, s.classify(ctx, nil, err))
	}
	if st == nil {
		kv := jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "watermill-dedup records (natsstore)",
			History:     1,
			TTL:         need,
			Storage:     s.cfg.Storage,
			Replicas:    s.cfg.Replicas,
		}
		if s.mode == TTLPerKey {
			// No MaxAge: each record has a TTL of its own.
			kv.TTL, kv.LimitMarkerTTL = 0, markerTTL
		}
		_, err := s.js.CreateKeyValue(ctx, kv)
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fail("create", err)
		}
		if st, err = s.js.Stream(ctx, streamName(bucket)); err != nil {
			return fail("open", err)
		}
	}
	conf := st.CachedInfo().Config
	prefix := subjectPrefix(bucket)
	if !slices.Contains(conf.Subjects, prefix+">") {
		return nil, fmt.Errorf("%w: stream %q is not the KV bucket %q (subjects %q)", ErrBucketConfig, conf.Name, bucket, conf.Subjects)
	}
	if s.mode == TTLPerKey && !conf.AllowMsgTTL {
		// A bucket created meanwhile by a store in the other mode, or a
		// server that ignored the setting.
		return nil, fmt.Errorf("%w: bucket %q (stream %s) has no per-message TTLs, which the store's mode needs",
			ErrBucketConfig, bucket, conf.Name)
	}
	switch {
	case s.cfg.asIs:
	case s.mode == TTLPerKey && conf.MaxAge > 0 && conf.MaxAge < need:
		// need is 2 × MaxLease + ClockSkew.
		return nil, fmt.Errorf("%w: bucket %q (stream %s) has MaxAge %s, the config needs none or %s at least",
			ErrBucketConfig, bucket, conf.Name, conf.MaxAge, need)
	case s.mode == TTLBucket && (conf.MaxAge <= 0 || conf.MaxAge < need):
		have := "no MaxAge (records would never be removed)"
		if conf.MaxAge > 0 {
			have = "MaxAge " + conf.MaxAge.String()
		}
		// need is max(MaxRetention, 2 × MaxLease) + ClockSkew.
		return nil, fmt.Errorf("%w: bucket %q (stream %s) has %s, the config needs MaxAge %s at least",
			ErrBucketConfig, bucket, conf.Name, have, need)
	}
	if conf.Discard == jetstream.DiscardOld && (conf.MaxMsgs > 0 || conf.MaxBytes > 0) {
		// The stream would drop the oldest records to make room, done
		// records within their retention among them: their duplicates
		// would run again.
		return nil, fmt.Errorf("%w: bucket %q has MaxMsgs %d and MaxBytes %d with discard-old, which drops live records",
			ErrBucketConfig, bucket, conf.MaxMsgs, conf.MaxBytes)
	}
	return &shard{
		bucket: bucket, stream: st, prefix: prefix,
		leaderReads: conf.Replicas > 1 || !conf.AllowDirect,
		msgGet:      "$JS.API.STREAM.MSG.GET." + conf.Name,
		maxMsgSize:  conf.MaxMsgSize,
		maxAge:      conf.MaxAge,
	}, nil
}

// headerRoom is what a record's message may need for its headers.
const headerRoom = 128

// maxData is the most data a done record keeps in a message of at most
// limit bytes, headers included (0 or less: no limit, which NATS always
// has).
func maxData(limit int64) int {
	if limit <= 0 {
		return 0
	}
	return max(int(limit)-valueHeadLen-byLen-headerRoom, 1)
}

// Capabilities implements [stores.Store]: leases up to MaxLease,
// retentions up to MaxRetention under TTLBucket, and under TTLPerKey up
// to MaxDurationLimit, or a bucket's MaxAge less ClockSkew when one has
// a MaxAge (which removes records whatever their TTL); data up to the server's maximum payload
// (as the connection reported it when the store was built) or the
// buckets' largest message (MaxValueSize), whichever is smaller, less the
// record's own head and headers. Data that a server reached later
// refuses as too large (a smaller max_payload after a reconnect, a
// bucket's limit lowered since) fails with [stores.ErrTooLarge] all the
// same.
func (s *Store) Capabilities() stores.Capabilities {
	return stores.Capabilities{Kind: "natsstore", MaxLease: s.cfg.MaxLease, MaxRetention: s.maxRetention, MaxData: s.maxData, Admin: true, Owners: true}
}

// TTLMode is how the store's records expire, as New picked it from
// Config.TTLMode, the server and the buckets: TTLBucket or TTLPerKey.
func (s *Store) TTLMode() TTLMode { return s.mode }

// Close implements [stores.Store]. It stops following the connection's
// status, waits for the undos still running in the background (bounded
// by ctx; ctx's error when it ends first, after cancelling them), and
// closes the connection only if Connect opened it. It is idempotent.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.bgMu.Lock()
		s.bgStopped = true
		s.bgMu.Unlock()
		done := make(chan struct{})
		go func() {
			s.bg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.closeErr = ctx.Err()
			s.bgCancel()
			<-done
		}
		s.bgCancel()
		s.watch.stop()
		s.violations.stop()
		if s.ownConn {
			s.nc.Close()
		}
	})
	return s.closeErr
}
