// Package natsstore is the dedup store on NATS JetStream key-value
// buckets (nats.go's jetstream package): a store shared by every
// consumer process that reaches the same NATS system, kept on disk and
// replicated by JetStream.
//
// Each (scope, key) is one KV key (a 128-bit digest of the pair, see
// the README), whose value says processing (token, lease_until) or done
// (expires_at, data). Every change is a write conditional on the key's
// revision, the KV compare-and-set: a Claim creates a key at the
// revision it read (none, a purge marker, an expired record), and
// Complete, Release and Extend rewrite a record only at the revision at
// which they read it processing under their token. So a write never
// lands on a record that changed since it was read, and two consumers
// can never both hold a key.
//
// JetStream before 2.11 has no per-key TTL: the store decides expiry
// itself, from the times in the value and its [stores.Clock], and the
// bucket's MaxAge (the KV TTL) removes a record some time after it
// stopped mattering. Consumers sharing a bucket must keep their clocks
// in sync (NTP), as with sqlstore. See [Config] for how MaxAge bounds the
// leases and retentions the store accepts.
//
// JetStream KV has no multi-key transaction. A Claim of several keys
// takes them one by one in a fixed order and gives back the ones it took
// when a later one turns out taken; see [Store.Claim] for the exact
// guarantee.
//
// A replicated bucket is read from its stream leader, so a read sees
// every write acknowledged before it; a single-replica one by direct
// gets. Config.Shards spreads the records over
// several buckets, whose leaders JetStream places on different servers
// of a cluster.
//
// The Store implements neither [stores.Admin] nor [stores.Inbox].
//
// The README next to this file describes the layout, the bytes each
// record takes, the limits and clustering.
package natsstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// Default values of Config fields, and bounds.
const (
	DefaultBucket       = "dedup"
	DefaultMaxLease     = time.Hour
	DefaultMaxRetention = 24 * time.Hour // dedup.DefaultRetention
	DefaultClockSkew    = time.Minute

	// MaxShards bounds Config.Shards.
	MaxShards = 64
	// MaxDurationLimit bounds Config.MaxLease and MaxRetention: a
	// century.
	MaxDurationLimit = 100 * 365 * 24 * time.Hour
)

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

// Headers the store writes.
const (
	hdrOperation = "KV-Operation" // a KV delete or purge marker
	opPurge      = "PURGE"
)

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("natsstore: invalid config")

// ErrBucketConfig is wrapped by New's error when a bucket exists but
// cannot hold the records the Config allows: a MaxAge (KV TTL) shorter
// than [Config.RequiredMaxAge], or none at all.
var ErrBucketConfig = errors.New("natsstore: the bucket's configuration does not fit the store's")

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Bucket is the KV bucket holding the records, created by New when
	// it does not exist. Stores sharing a NATS system and a Bucket share
	// their records, which is how several consumer processes dedup
	// together. The default is "dedup". It may hold letters, digits, '-'
	// and '_'.
	Bucket string

	// Shards spreads the records over this many buckets, Bucket-0 to
	// Bucket-<Shards-1>, each (scope, key) in the one its digest picks:
	// each bucket is a JetStream stream with its own leader, so in a
	// cluster the writes of the shards go to different servers. The
	// default, 0 or 1, is one bucket named Bucket. At most MaxShards.
	// Changing it forgets the records written before.
	Shards int

	// MaxLease is the longest lease Claim and Extend accept, and
	// MaxRetention the longest retention Complete accepts; longer ones
	// fail with stores.ErrInvalidArgument before any I/O. Defaults:
	// DefaultMaxLease (1h) and DefaultMaxRetention (24h, the
	// middleware's default retention). At most MaxDurationLimit.
	//
	// They decide the bucket's MaxAge (see RequiredMaxAge): a bucket
	// keeps every record for MaxAge after its last write, whatever its
	// own retention, so they are also what the bucket's disk holds:
	// message rate × MaxAge records.
	MaxLease     time.Duration
	MaxRetention time.Duration

	// ClockSkew is how far apart the clocks of the consumer processes
	// and the NATS servers may be: the margin RequiredMaxAge adds. The
	// default is DefaultClockSkew (1 minute).
	ClockSkew time.Duration

	// Replicas and Storage are the replication factor (1, 3 or 5 in a
	// cluster; default 1) and storage (default file) of the buckets New
	// creates. A bucket that exists is used as it is.
	Replicas int
	Storage  jetstream.StorageType

	// Clock tells the time of leases and expiry. nil means the system
	// clock.
	Clock stores.Clock
}

var bucketRe = regexp.MustCompile(`\A[a-zA-Z0-9_-]+\z`)

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Bucket != "" && !bucketRe.MatchString(c.Bucket):
		return bad("Bucket %q may hold letters, digits, '-' and '_' only", c.Bucket)
	case c.Shards < 0 || c.Shards > MaxShards:
		return bad("Shards must be between 0 and %d, got %d", MaxShards, c.Shards)
	case c.MaxLease < 0 || c.MaxLease > MaxDurationLimit:
		return bad("MaxLease must be between 0 (default) and %s, got %s", MaxDurationLimit, c.MaxLease)
	case c.MaxRetention < 0 || c.MaxRetention > MaxDurationLimit:
		return bad("MaxRetention must be between 0 (default) and %s, got %s", MaxDurationLimit, c.MaxRetention)
	case c.ClockSkew < 0 || c.ClockSkew > MaxDurationLimit:
		return bad("ClockSkew must be between 0 (default) and %s, got %s", MaxDurationLimit, c.ClockSkew)
	case c.Replicas < 0 || c.Replicas > 5:
		return bad("Replicas must be between 0 (default) and 5, got %d", c.Replicas)
	case c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage:
		return bad("Storage must be jetstream.FileStorage or MemoryStorage, got %d", c.Storage)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.MaxRetention == 0 {
		c.MaxRetention = DefaultMaxRetention
	}
	if c.ClockSkew == 0 {
		c.ClockSkew = DefaultClockSkew
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	c.Clock = stores.ClockOrSystem(c.Clock)
}

// RequiredMaxAge is the shortest bucket MaxAge (KV TTL) that keeps every
// record as long as the store contract needs it, with the defaults
// filled in:
//
//	max(MaxRetention, 2 × MaxLease) + ClockSkew
//
// A done record must last its retention; a processing record its lease,
// and one more lease after it ran out, so that a takeover then is
// reported as one (Claim.Takeover). MaxAge counts from the record's last
// write on the server's clock; ClockSkew covers the distance between
// that clock and the consumers'. New creates missing buckets with
// exactly this MaxAge and refuses existing ones with a shorter one
// ([ErrBucketConfig]).
func (c Config) RequiredMaxAge() time.Duration {
	c.setDefaults()
	return max(c.MaxRetention, 2*c.MaxLease) + c.ClockSkew
}

// Buckets returns the names of the buckets the store uses, with the
// defaults filled in.
func (c Config) Buckets() []string {
	c.setDefaults()
	if c.Shards == 1 {
		return []string{c.Bucket}
	}
	out := make([]string, c.Shards)
	for i := range out {
		out[i] = c.Bucket + "-" + strconv.Itoa(i)
	}
	return out
}

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
	watch   *connWatch

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// Background undos of calls whose callers had gone.
	bg        sync.WaitGroup
	bgMu      sync.Mutex
	bgStopped bool // set by Close: no new background undo
	bgCtx     context.Context
	bgCancel  context.CancelFunc

	// testAfterWrite, when set, runs after each successful write of a
	// multi-key call, with the index of the write (tests only).
	testAfterWrite func(op string, i int)
}

var _ stores.Store = (*Store)(nil)

// New returns a Store on nc, a connection the caller owns: the store
// never closes it (close it yourself after closing the store). New opens
// the buckets (creating those that do not exist, see Config) and fails
// when NATS cannot be reached (an error wrapping stores.ErrUnavailable),
// when JetStream is not enabled, or when a bucket exists with a MaxAge
// shorter than the config needs ([ErrBucketConfig]). ctx bounds that.
//
// The store follows the connection's status: while nats.go is
// reconnecting, calls fail at once with stores.ErrUnavailable instead of
// being buffered, and calls in flight when the connection drops fail so
// too instead of waiting for their deadline.
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
	limit := nc.MaxPayload()
	for _, b := range cfg.Buckets() {
		sh, err := s.openBucket(ctx, b)
		if err != nil {
			return nil, err
		}
		s.shards = append(s.shards, sh)
		if sh.maxMsgSize > 0 && (limit <= 0 || int64(sh.maxMsgSize) < limit) {
			limit = int64(sh.maxMsgSize)
		}
	}
	s.maxData = maxData(limit)
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	s.watch = newConnWatch(nc)
	return s, nil
}

// openBucket opens bucket, creating it when it does not exist, and
// checks its MaxAge.
func (s *Store) openBucket(ctx context.Context, bucket string) (*shard, error) {
	need := s.cfg.RequiredMaxAge()
	fail := func(what string, err error) (*shard, error) {
		return nil, fmt.Errorf("natsstore: %s bucket %q: %w", what, bucket, classify(ctx, nil, err))
	}
	st, err := s.js.Stream(ctx, streamName(bucket))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = s.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "watermill-dedup records (natsstore)",
			History:     1,
			TTL:         need,
			Storage:     s.cfg.Storage,
			Replicas:    s.cfg.Replicas,
		})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fail("create", err)
		}
		st, err = s.js.Stream(ctx, streamName(bucket))
	}
	if err != nil {
		return fail("open", err)
	}
	conf := st.CachedInfo().Config
	prefix := subjectPrefix(bucket)
	if !slices.Contains(conf.Subjects, prefix+">") {
		return nil, fmt.Errorf("%w: stream %q is not the KV bucket %q (subjects %q)", ErrBucketConfig, conf.Name, bucket, conf.Subjects)
	}
	if conf.MaxAge <= 0 || conf.MaxAge < need {
		have := "no MaxAge (records would never be removed)"
		if conf.MaxAge > 0 {
			have = "MaxAge " + conf.MaxAge.String()
		}
		return nil, fmt.Errorf("%w: bucket %q has %s, the config needs at least %s (max(MaxRetention, 2 × MaxLease) + ClockSkew): lower MaxLease or MaxRetention, or raise the bucket's MaxAge (nats stream edit %s --max-age)",
			ErrBucketConfig, bucket, have, need, conf.Name)
	}
	if conf.Discard == jetstream.DiscardOld && (conf.MaxMsgs > 0 || conf.MaxBytes > 0) {
		// The stream would drop the oldest records to make room, done
		// records within their retention among them: their duplicates
		// would run again.
		return nil, fmt.Errorf("%w: bucket %q has MaxMsgs %d and MaxBytes %d with the discard-old policy, which drops records before their retention ends: remove the limits or use discard-new (writes then fail when the bucket is full)",
			ErrBucketConfig, bucket, conf.MaxMsgs, conf.MaxBytes)
	}
	return &shard{
		bucket: bucket, stream: st, prefix: prefix,
		leaderReads: conf.Replicas > 1 || !conf.AllowDirect,
		msgGet:      "$JS.API.STREAM.MSG.GET." + conf.Name,
		maxMsgSize:  conf.MaxMsgSize,
	}, nil
}

// record is one (scope, key) of a call.
type record struct {
	sh   *shard
	subj string
}

// records returns the records of keys in scope, once each, in the
// caller's order.
func (s *Store) records(scope string, keys []string) []record {
	out := make([]record, 0, len(keys))
	for _, k := range keys {
		d := digest(scope, k)
		sh := s.shards[shardOf(d, len(s.shards))]
		r := record{sh: sh, subj: sh.prefix + encodeKey(d)}
		if !slices.ContainsFunc(out, func(o record) bool { return o.subj == r.subj }) {
			out = append(out, r)
		}
	}
	return out
}

// writeOrder returns the indexes of recs in the order every call writes
// them: by subject, a total order all processes agree on.
// subjects returns the subjects of recs in write order.
func subjects(recs []record) []string {
	out := make([]string, 0, len(recs))
	for _, i := range writeOrder(recs) {
		out = append(out, recs[i].subj)
	}
	return out
}

func writeOrder(recs []record) []int {
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case recs[a].subj < recs[b].subj:
			return -1
		case recs[a].subj > recs[b].subj:
			return 1
		}
		return 0
	})
	return idx
}

// read returns the latest revision of r.
//
// A single-replica bucket answers a direct get from its one server. A
// replicated one is read from its stream leader: a direct get may be
// answered by a follower that has not applied the last writes yet, and
// such a stale read would make a Complete right after its Claim find no
// record (ErrLostClaim), or a Claim miss a done record (the write that
// follows fails its revision check and the claim reads again, up to
// InProgress). Writes are safe either way: each is checked against the
// key's last revision by the leader.
func (s *Store) read(ctx context.Context, r record) (entry, error) {
	var (
		rev    uint64
		marker bool
		data   []byte
		err    error
	)
	if r.sh.leaderReads {
		rev, marker, data, err = s.leaderRead(ctx, r)
	} else {
		var m *jetstream.RawStreamMsg
		m, err = r.sh.stream.GetLastMsgForSubject(ctx, r.subj)
		if err == nil {
			rev, marker, data = m.Sequence, m.Header.Get(hdrOperation) != "", m.Data
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, err
	}
	e := entry{rev: rev}
	if marker {
		return e, nil // a delete or purge marker
	}
	if err := decodeValue(&e, data); err != nil {
		return entry{}, fmt.Errorf("%w: subject %s, revision %d", err, r.subj, rev)
	}
	return e, nil
}

// msgGetResponse is the stream leader's answer to STREAM.MSG.GET.
type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Sequence uint64 `json:"seq"`
		Header   []byte `json:"hdrs,omitempty"`
		Data     []byte `json:"data,omitempty"`
	} `json:"message,omitempty"`
}

// leaderRead reads the last message of r from its stream's leader.
func (s *Store) leaderRead(ctx context.Context, r record) (rev uint64, marker bool, data []byte, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{r.subj})
	if err != nil {
		return 0, false, nil, err
	}
	m, err := s.nc.RequestWithContext(ctx, r.sh.msgGet, req)
	if err != nil {
		return 0, false, nil, err
	}
	var resp msgGetResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, false, nil, fmt.Errorf("natsstore: bad STREAM.MSG.GET reply: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, false, nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return 0, false, nil, fmt.Errorf("nats: %w", resp.Error)
	case resp.Message == nil:
		return 0, false, nil, errors.New("natsstore: empty STREAM.MSG.GET reply")
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return 0, false, nil, err
		}
		marker = h.Get(hdrOperation) != ""
	}
	return resp.Message.Sequence, marker, resp.Message.Data, nil
}

// write puts value under r, or a purge marker when value is nil, if the
// key's last revision is rev (0: the key has no message), and returns
// the new revision.
func (s *Store) write(ctx context.Context, r record, value []byte, rev uint64) (uint64, error) {
	m := nats.NewMsg(r.subj)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if value == nil {
		m.Header.Set(hdrOperation, opPurge)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	} else {
		m.Data = value
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// newToken returns a fresh fencing token: 128 random bits.
func newToken() string { return rand.Text() }

// checkDuration refuses a duration past the config's bound.
func checkDuration(what string, d, bound time.Duration) error {
	if d > bound {
		return fmt.Errorf("%w: %s %s is longer than the store's bound of %s (Config.Max%s; the bucket's MaxAge depends on it)",
			stores.ErrInvalidArgument, what, d, bound, map[string]string{"lease": "Lease", "retention": "Retention"}[what])
	}
	return nil
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

// Claim implements [stores.Store].
//
// A claim of one key first tries to create it (a write at revision 0):
// a key never written, the common case of a new message, is claimed in
// one round trip. Otherwise, and for several keys, it reads every key,
// in the caller's order, and answers Duplicate at
// the first live done record and InProgress when a key is processing
// under a live lease, without writing anything. Otherwise it writes a
// processing record under a new token to every key, one key after the
// other in a fixed order (by subject), each write conditional on the
// revision it read. If a write finds its key changed since the read (a
// concurrent claim, complete or release), the keys already written are
// put back as they were, at the revision this claim gave them (a
// taken-over expired lease gets its old owner's record back, so that
// owner can still complete), and the claim starts again from the reads;
// after 8 such rounds it answers InProgress.
//
// So the claim is all-or-nothing and no key is ever held by two claims:
// each key is taken by a compare-and-set, and a claim that returns
// Claimed holds every key. What it gives up is isolation: while a claim
// is under way, a concurrent claim sharing one of its keys may see that
// key held and answer InProgress although the first claim then gives the
// key back, so both messages are retried later (never lost, never run
// twice); and the reads are not one snapshot, so under concurrent writers
// the Duplicate's Data is that of the first key seen done. If the claim
// cannot put a key back (the connection dropped, or the caller's context
// ended while a write was out and its outcome is unknown), the key stays
// processing under a token nobody holds until its lease runs out, and is
// then taken over like the key of a crashed consumer. Undos of a caller
// that has gone run in the background, bounded by 2s, until Close.
func (s *Store) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckKeys(keys), storekit.CheckLease(lease),
		checkDuration("lease", lease, s.cfg.MaxLease)); err != nil {
		return nil, fmt.Errorf("natsstore: claim: %w", err)
	}
	recs := s.records(scope, keys)
	c := &stores.Claim{Scope: scope, Keys: slices.Clone(keys)}
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsstore: claim: %w", err)
	}
	defer release()
	if len(recs) == 1 {
		// The common case, a new message: one create, one round trip.
		ok, err := s.claimNew(ctx, cctx, recs[0], lease, c)
		if err != nil {
			return nil, fmt.Errorf("natsstore: claim: %w", s.classify(ctx, cctx, err))
		}
		if ok {
			return c, nil
		}
	}
	for attempt := 1; ; attempt++ {
		res, err := s.claimOnce(ctx, cctx, recs, lease, c)
		if err != nil {
			return nil, fmt.Errorf("natsstore: claim: %w", s.classify(ctx, cctx, err))
		}
		if res || attempt == maxClaimAttempts {
			if !res {
				c.Result = stores.InProgress
			}
			return c, nil
		}
	}
}

// claimNew claims r if it has never been written (or MaxAge removed
// its last message): a write at revision 0, the KV create. It reports
// false, having written nothing, when the key has a message (a record or
// a purge marker): the claim then reads it.
func (s *Store) claimNew(ctx, cctx context.Context, r record, lease time.Duration, c *stores.Claim) (bool, error) {
	token := newToken()
	_, err := s.write(cctx, r, processingValue(addNanos(s.clock.Now().UnixNano(), lease), token), 0)
	switch {
	case err == nil:
		c.Result, c.Token = stores.Claimed, token
		return true, nil
	case isConflict(err):
		return false, nil
	}
	s.undo(ctx, []undoItem{{rec: r, token: token}}) // the outcome is unknown
	return false, err
}

// claimOnce runs one round of Claim. It reports false, with c
// unchanged, when a write found its key changed since the read and the
// claim must start again.
func (s *Store) claimOnce(ctx, cctx context.Context, recs []record, lease time.Duration, c *stores.Claim) (bool, error) {
	now := s.clock.Now().UnixNano()
	entries := make([]entry, len(recs))
	live, takeover := false, false
	for i, r := range recs {
		e, err := s.read(cctx, r)
		if err != nil {
			return false, err
		}
		switch {
		case e.state == stateDone && e.at > now:
			c.Result, c.Data = stores.Duplicate, e.data
			return true, nil
		case e.state == stateProcessing && e.at > now:
			live = true
		case e.state == stateProcessing:
			takeover = true
		}
		entries[i] = e
	}
	if live {
		c.Result = stores.InProgress
		return true, nil
	}
	token := newToken()
	value := processingValue(addNanos(now, lease), token)
	var undo []undoItem
	for n, i := range writeOrder(recs) {
		rev, err := s.write(cctx, recs[i], value, entries[i].rev)
		if err != nil {
			if !isConflict(err) {
				// The outcome of this write is unknown: undo finds out.
				undo = append(undo, undoItem{rec: recs[i], prev: entries[i], token: token})
			}
			s.undo(ctx, undo)
			if isConflict(err) {
				return false, nil
			}
			return false, err
		}
		undo = append(undo, undoItem{rec: recs[i], prev: entries[i], rev: rev})
		if s.testAfterWrite != nil && n < len(recs)-1 {
			s.testAfterWrite("claim", n)
		}
	}
	c.Result, c.Token, c.Takeover = stores.Claimed, token, takeover
	return true, nil
}

// undoItem is a write to take back: put prev back under rec, at rev, the
// revision the write made, or when rev is 0 (the write's outcome is
// unknown) at the revision found, if the key holds token.
type undoItem struct {
	rec   record
	prev  entry
	rev   uint64
	token string
}

// undo puts back what items wrote, last first. It runs at once when the
// caller is still there, in the background (until Close) when its
// context has ended; either way bounded by undoTimeout. A key that
// changed again since is left alone: it is someone else's now.
func (s *Store) undo(ctx context.Context, items []undoItem) {
	if len(items) == 0 {
		return
	}
	if ctx.Err() == nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		s.undoNow(uctx, items)
		return
	}
	s.bgMu.Lock()
	if s.bgStopped {
		s.bgMu.Unlock()
		return // closed: the leases will run out
	}
	s.bg.Add(1)
	s.bgMu.Unlock()
	go func() {
		defer s.bg.Done()
		uctx, cancel := context.WithTimeout(s.bgCtx, undoTimeout)
		defer cancel()
		s.undoNow(uctx, items)
	}()
}

func (s *Store) undoNow(ctx context.Context, items []undoItem) {
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return // the connection is down: the leases will run out
	}
	defer release()
	for i := len(items) - 1; i >= 0; i-- {
		it := items[i]
		rev := it.rev
		if rev == 0 {
			e, err := s.read(cctx, it.rec)
			if err != nil || e.state != stateProcessing || e.token != it.token {
				continue
			}
			rev = e.rev
		}
		var value []byte // none: a purge marker
		if it.prev.state == stateProcessing {
			value = it.prev.raw
		}
		_, _ = s.write(cctx, it.rec, value, rev)
	}
}

// Complete implements [stores.Store]. See fenced for how a claim of
// several keys is completed.
func (s *Store) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c), storekit.CheckRetention(retention),
		checkDuration("retention", retention, s.cfg.MaxRetention), s.Capabilities().CheckData(data)); err != nil {
		return fmt.Errorf("natsstore: complete: %w", err)
	}
	by := completedBy(c.Token, subjects(s.records(c.Scope, c.Keys)))
	return s.fenced(ctx, "complete", c, func(now int64) []byte { return doneValue(addNanos(now, retention), by, data) })
}

// Release implements [stores.Store]. The records become KV purge
// markers, which the bucket's MaxAge removes.
func (s *Store) Release(ctx context.Context, c *stores.Claim) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c)); err != nil {
		return fmt.Errorf("natsstore: release: %w", err)
	}
	return s.fenced(ctx, "release", c, func(int64) []byte { return nil })
}

// Extend implements [stores.Store].
func (s *Store) Extend(ctx context.Context, c *stores.Claim, lease time.Duration) error {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckClaim(c), storekit.CheckLease(lease),
		checkDuration("lease", lease, s.cfg.MaxLease)); err != nil {
		return fmt.Errorf("natsstore: extend: %w", err)
	}
	return s.fenced(ctx, "extend", c, func(now int64) []byte { return processingValue(addNanos(now, lease), c.Token) })
}

// fenced runs Complete, Release or Extend: it reads every key of c and
// fails with ErrLostClaim, writing nothing, unless each is processing
// under c's token (whether or not its lease ran out); then it writes the
// new value (nil: a purge marker) to each key in the fixed order, each
// write conditional on the revision read.
//
// While the claim's lease is live no other claim writes its keys, so
// the writes all succeed: the call is all-or-nothing. A connection lost
// between two writes leaves the call half done (the keys cannot be put
// back without it) and fails it as an outage; a Complete retried then
// finds the keys it completed (done by this claim's token, see
// completedBy) and completes the rest. If a write finds
// its key changed (the lease ran out and another claim took that key
// over between the read and the write, or an operator deleted it), the
// keys already written are put back to this claim's processing record
// and the call fails with ErrLostClaim; meanwhile a Claim of such a key
// may have seen it done (Complete: the handler did run) or free.
func (s *Store) fenced(ctx context.Context, op string, c *stores.Claim, value func(now int64) []byte) error {
	recs := s.records(c.Scope, c.Keys)
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return fmt.Errorf("natsstore: %s: %w", op, err)
	}
	defer release()
	entries := make([]entry, len(recs))
	// ours: keys an earlier attempt of this Complete has completed (it was
	// cut before it wrote them all).
	ours := make([]bool, len(recs))
	nOurs := 0
	by := completedBy(c.Token, subjects(recs))
	for i, r := range recs {
		e, err := s.read(cctx, r)
		if err != nil {
			return fmt.Errorf("natsstore: %s: %w", op, s.classify(ctx, cctx, err))
		}
		if op == "complete" && e.state == stateDone && e.by == by {
			ours[i] = true
			nOurs++
			continue
		}
		if e.state != stateProcessing || e.token != c.Token {
			return fmt.Errorf("natsstore: %s: %w: key %d of the claim is %s", op, stores.ErrLostClaim, i, describe(e, c.Token))
		}
		entries[i] = e
	}
	if nOurs == len(recs) {
		return fmt.Errorf("natsstore: %s: %w: the claim is completed already", op, stores.ErrLostClaim)
	}
	v := value(s.clock.Now().UnixNano())
	var undo []undoItem
	for n, i := range writeOrder(recs) {
		if ours[i] {
			continue
		}
		rev, err := s.write(cctx, recs[i], v, entries[i].rev)
		if err != nil {
			// Put the keys already written back to this claim's
			// processing records, so that a retry of the call can
			// succeed. A write whose outcome is unknown is left as it
			// is: if it landed, the key is this call's (done, released
			// or extended), and a retry fails with ErrLostClaim, which
			// the middleware reconciles by claiming again.
			s.undo(ctx, undo)
			if isConflict(err) {
				return fmt.Errorf("natsstore: %s: %w: a key of the claim changed under it", op, stores.ErrLostClaim)
			}
			return fmt.Errorf("natsstore: %s: %w", op, s.classify(ctx, cctx, err))
		}
		undo = append(undo, undoItem{rec: recs[i], prev: entries[i], rev: rev})
		if s.testAfterWrite != nil && n < len(recs)-1 {
			s.testAfterWrite(op, n)
		}
	}
	return nil
}

func describe(e entry, token string) string {
	switch {
	case e.state == stateNone:
		return "gone"
	case e.state == stateDone:
		return "done"
	case e.token != token:
		return "held by another claim"
	}
	return "processing"
}

// classify is the package's classify, with a closed store first.
func (s *Store) classify(ctx, cctx context.Context, err error) error {
	err = classify(ctx, cctx, err)
	if s.closed.Load() && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", stores.ErrClosed, err)
	}
	return err
}

// Capabilities implements [stores.Store]: leases up to MaxLease,
// retentions up to MaxRetention, data up to the server's maximum payload
// (as the connection reported it when the store was built) or the
// buckets' largest message (MaxValueSize), whichever is smaller, less the
// record's own head and headers. Data that a server reached later
// refuses as too large (a smaller max_payload after a reconnect, a
// bucket's limit lowered since) fails with [stores.ErrTooLarge] all the
// same.
func (s *Store) Capabilities() stores.Capabilities {
	return stores.Capabilities{Kind: "natsstore", MaxLease: s.cfg.MaxLease, MaxRetention: s.cfg.MaxRetention, MaxData: s.maxData}
}

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
		if s.ownConn {
			s.nc.Close()
		}
	})
	return s.closeErr
}
