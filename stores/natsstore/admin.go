package natsstore

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storekit"
)

// The admin interface ([stores.Admin]). A record is one KV key, a digest
// of (scope, key) (see layout.go) that keeps neither: Get and Delete find
// a record by (scope, key), List lists records by ID (the KV key) and
// cannot select a scope or a key prefix, and Stats has no per-scope
// counts.
//
// List, Stats and Purge read the buckets in stream order through an
// ephemeral consumer of their own (acks none, in memory, removed by the
// server a minute after a caller that died left it), a batch of
// scanBatch messages at a time, up to the last message each stream held
// when the call reached it. Delete and Purge write a purge marker at the
// revision they read, as Release does: a record that changed since is
// left as it is.

var _ stores.Admin = (*Store)(nil)

// Internal bounds of the admin calls.
const (
	// scanBatch is the most messages one pull of a scan asks for: the
	// most records (of up to MaxData bytes each) a scan holds at once
	// besides a List's page.
	scanBatch = 100
	// scanInactive is how long the server keeps a scan's consumer that
	// its caller left (a process that died mid-scan).
	scanInactive = time.Minute
	// maxScanRestarts bounds how often a scan that lost messages on the
	// way starts again after the last one it read.
	maxScanRestarts = 8
	// maxDeleteAttempts bounds how often Delete reads again a record that
	// changed between its read and its write.
	maxDeleteAttempts = 8
)

// errNotByScope is the error of a List by scope or key.
var errNotByScope = fmt.Errorf("%w: records are kept under a digest of (scope, key) (the KV key), so they cannot be listed or counted by scope or key; Get finds one by its scope and key", stores.ErrNotSupported)

// Get implements [stores.Admin].
func (s *Store) Get(ctx context.Context, scope, key string) (stores.Record, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckRecordKey(key)); err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: get: %w", err)
	}
	r := s.records(scope, []string{key})[0]
	rec, err := s.get(ctx, r, fmt.Sprintf("scope %q key %q (id %s)", scope, key, r.id()))
	if err != nil {
		return stores.Record{}, err
	}
	return known(rec, scope, key), nil
}

// GetByID implements [stores.Admin]: id is the record's KV key.
func (s *Store) GetByID(ctx context.Context, id string) (stores.Record, error) {
	r, err := s.recordOfID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: get: %w", err)
	}
	return s.get(ctx, r, "id "+id)
}

// get reads the record r; what names it in errors.
func (s *Store) get(ctx context.Context, r record, what string) (stores.Record, error) {
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: get: %w", err)
	}
	defer release()
	e, err := s.read(cctx, r)
	if err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: get: %w", s.classify(ctx, cctx, err))
	}
	if e.state == stateNone {
		return stores.Record{}, fmt.Errorf("natsstore: get: %w: %s", stores.ErrNotFound, what)
	}
	return s.adminRecord(r.id(), e, s.clock.Now().UnixNano()), nil
}

// Delete implements [stores.Admin]: a read of the record, then a purge
// marker written at the revision read (the KV compare-and-set), so that
// a record that changed in between is read again, never deleted in a
// state it was not seen in.
func (s *Store) Delete(ctx context.Context, scope, key string, want stores.RecordState) (stores.Record, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load(), storekit.CheckRecordKey(key), storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: delete: %w", err)
	}
	r := s.records(scope, []string{key})[0]
	rec, err := s.delete(ctx, r, want, fmt.Sprintf("scope %q key %q (id %s)", scope, key, r.id()))
	if rec.ID != "" {
		rec = known(rec, scope, key)
	}
	return rec, err
}

// DeleteByID implements [stores.Admin], as Delete does; id as in
// GetByID.
func (s *Store) DeleteByID(ctx context.Context, id string, want stores.RecordState) (stores.Record, error) {
	r, err := s.recordOfID(id)
	if err := storekit.CheckCall(ctx, s.closed.Load(), err, storekit.CheckState(want)); err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: delete: %w", err)
	}
	return s.delete(ctx, r, want, "id "+id)
}

// delete deletes the record r if it is in state want; what names it in
// errors.
func (s *Store) delete(ctx context.Context, r record, want stores.RecordState, what string) (stores.Record, error) {
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return stores.Record{}, fmt.Errorf("natsstore: delete: %w", err)
	}
	defer release()
	for attempt := 1; ; attempt++ {
		e, err := s.read(cctx, r)
		if err != nil {
			return stores.Record{}, fmt.Errorf("natsstore: delete: %w", s.classify(ctx, cctx, err))
		}
		if e.state == stateNone {
			return stores.Record{}, fmt.Errorf("natsstore: delete: %w: %s", stores.ErrNotFound, what)
		}
		rec := s.adminRecord(r.id(), e, s.clock.Now().UnixNano())
		if rec.State != want {
			return rec, fmt.Errorf("natsstore: delete: %w: %s is %s, not %s", stores.ErrWrongState, what, rec.State, want)
		}
		if s.testBeforeDelete != nil {
			s.testBeforeDelete()
		}
		_, err = s.write(cctx, r, nil, e.rev, 0)
		switch {
		case err == nil:
			return rec, nil
		case !isConflict(err):
			return stores.Record{}, fmt.Errorf("natsstore: delete: %w", s.classify(ctx, cctx, err))
		case attempt == maxDeleteAttempts:
			return stores.Record{}, fmt.Errorf("natsstore: delete: %w: %s changed %d times between its read and its deletion; nothing deleted",
				stores.ErrUnavailable, what, attempt)
		}
	}
}

// recordOfID is the record whose ID (its KV key) is id, in its shard.
func (s *Store) recordOfID(id string) (record, error) {
	d, err := base64.RawURLEncoding.DecodeString(id)
	if len(id) != KeyLen || err != nil || len(d) != digestLen || encodeKey([digestLen]byte(d)) != id {
		return record{}, fmt.Errorf("%w: %q is not a natsstore record ID (a KV key of %d characters)", stores.ErrInvalidArgument, id, KeyLen)
	}
	sh := s.shards[shardOf([digestLen]byte(d), len(s.shards))]
	return record{sh: sh, subj: sh.prefix + id}, nil
}

// List implements [stores.Admin]: records in stream order, bucket after
// bucket. A Scope or KeyPrefix fails with [stores.ErrNotSupported]. The
// cursor is the bucket and the stream sequence of the page's last
// record: a record written (claimed, completed, extended) after the list
// started moves past it and is listed again, in its new state.
func (s *Store) List(ctx context.Context, opts stores.ListOptions) ([]stores.Record, string, error) {
	opts, err := storekit.CheckListOptions(opts)
	var cur listCursor
	if err == nil && opts.After != "" {
		cur, err = s.parseCursor(opts.After)
	}
	if err := storekit.CheckCall(ctx, s.closed.Load(), err); err != nil {
		return nil, "", fmt.Errorf("natsstore: list: %w", err)
	}
	if opts.Scope != "" || opts.KeyPrefix != "" {
		return nil, "", fmt.Errorf("natsstore: list: %w", errNotByScope)
	}
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("natsstore: list: %w", err)
	}
	defer release()
	now := s.clock.Now().UnixNano()
	var out []stores.Record
	for i := cur.shard; i < len(s.shards); i++ {
		from := uint64(1)
		if i == cur.shard {
			from = cur.seq + 1
		}
		next := ""
		_, err := s.scan(cctx, s.shards[i], from, func(m scanned) bool {
			if m.e.state == stateNone || (opts.State != 0 && recordState(m.e) != opts.State) {
				return true
			}
			out = append(out, s.adminRecord(m.id, m.e, now))
			if len(out) < opts.Limit {
				return true
			}
			switch {
			case !m.last:
				next = listCursor{shard: i, seq: m.seq}.String()
			case i+1 < len(s.shards):
				next = listCursor{shard: i + 1}.String()
			}
			return false
		})
		if err != nil {
			return nil, "", fmt.Errorf("natsstore: list: bucket %s: %w", s.shards[i].bucket, s.classify(ctx, cctx, err))
		}
		if len(out) == opts.Limit {
			return out, next, nil
		}
	}
	return out, "", nil
}

// Stats implements [stores.Admin]: it reads every record. Bytes is the
// buckets' stream bytes (JetStream's State.Bytes, purge markers
// included).
func (s *Store) Stats(ctx context.Context) (stores.Stats, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return stores.Stats{}, fmt.Errorf("natsstore: stats: %w", err)
	}
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return stores.Stats{}, fmt.Errorf("natsstore: stats: %w", err)
	}
	defer release()
	now := s.clock.Now().UnixNano()
	var (
		st             stores.Stats
		oldest, newest int64
		anyDone        bool
	)
	for _, sh := range s.shards {
		bytes, err := s.scan(cctx, sh, 1, func(m scanned) bool {
			e := m.e
			switch {
			case e.state == stateNone:
				return true
			case e.at <= now:
				st.Expired++
			case e.state == stateDone:
				st.Done++
			default:
				st.Processing++
			}
			if e.state == stateDone {
				if !anyDone || e.at < oldest {
					oldest = e.at
				}
				if !anyDone || e.at > newest {
					newest = e.at
				}
				anyDone = true
			}
			return true
		})
		if err != nil {
			return stores.Stats{}, fmt.Errorf("natsstore: stats: bucket %s: %w", sh.bucket, s.classify(ctx, cctx, err))
		}
		st.Bytes += int64(bytes)
	}
	if anyDone {
		st.OldestExpiry, st.NewestExpiry = time.Unix(0, oldest), time.Unix(0, newest)
	}
	return st, nil
}

// Purge implements [stores.Admin]: it reads every record and puts a
// purge marker, at the revision read, in place of each done record past
// its retention and each processing record whose lease ended more than
// MaxLease ago (longer than any lease the store gives, so a takeover
// within a lease of the end is still reported as one). It returns how
// many it replaced. The records are then gone for Claim, Get, List and
// Stats; the bucket's MaxAge removes the markers, as it does every
// record, MaxAge after they were written: Purge frees little space.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := storekit.CheckCall(ctx, s.closed.Load()); err != nil {
		return 0, fmt.Errorf("natsstore: purge: %w", err)
	}
	cctx, release, err := s.watch.callCtx(ctx)
	if err != nil {
		return 0, fmt.Errorf("natsstore: purge: %w", err)
	}
	defer release()
	now := s.clock.Now().UnixNano()
	var n int64
	for _, sh := range s.shards {
		var werr error
		_, err := s.scan(cctx, sh, 1, func(m scanned) bool {
			e := m.e
			if !(e.state == stateDone && e.at <= now) && !(e.state == stateProcessing && addNanos(e.at, s.cfg.MaxLease) < now) {
				return true
			}
			_, werr = s.write(cctx, record{sh: sh, subj: sh.prefix + m.id}, nil, e.rev, 0)
			if isConflict(werr) {
				werr = nil // written since: someone else's record now
				return true
			}
			if werr == nil {
				n++
			}
			return werr == nil
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			return n, fmt.Errorf("natsstore: purge: bucket %s, after %d records: %w", sh.bucket, n, s.classify(ctx, cctx, err))
		}
	}
	return n, nil
}

// id is the record's ID: its KV key.
func (r record) id() string { return strings.TrimPrefix(r.subj, r.sh.prefix) }

// known fills in the scope and key of a record found by them.
func known(rec stores.Record, scope, key string) stores.Record {
	rec.Scope, rec.Key, rec.ScopeKnown, rec.KeyKnown = scope, key, true, true
	return rec
}

func recordState(e entry) stores.RecordState {
	if e.state == stateDone {
		return stores.StateDone
	}
	return stores.StateProcessing
}

// adminRecord describes e, the record under the KV key id, at now.
func (s *Store) adminRecord(id string, e entry, now int64) stores.Record {
	rec := stores.Record{ID: id, State: recordState(e), Expired: e.at <= now}
	at := time.Unix(0, e.at)
	if e.state == stateDone {
		rec.ExpiresAt = at
		if len(e.data) > 0 {
			rec.Data = append([]byte(nil), e.data...)
		}
	} else {
		rec.Token, rec.LeaseUntil = e.token, at
		if len(e.owner) > 0 {
			rec.Owner = append([]byte(nil), e.owner...)
		}
	}
	return rec
}

// scanned is a message a scan read: a record, or (state none) a purge
// marker or an older revision of a key.
type scanned struct {
	seq  uint64 // its stream sequence, the key's revision
	id   string // its KV key
	e    entry
	last bool // the scan holds no later message
}

// scan reads the messages of sh in stream order, from sequence from to
// the last the stream held when scan started, and calls fn with each
// until fn returns false. It returns the stream's bytes.
//
// It pulls them through an ephemeral consumer of its own, created at
// from and deleted when the scan ends. A pull asks for what the
// consumer has pending (at most scanBatch), without waiting: the server
// answers with the messages there are, and says when there are none, so
// the scan ends on the server's word, never on a timer. Messages lost on
// the way (a gap in the consumer's sequence) make it start again after
// the last one it read.
func (s *Store) scan(ctx context.Context, sh *shard, from uint64, fn func(scanned) bool) (bytes uint64, err error) {
	info, err := sh.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	state := info.State
	if state.Msgs == 0 || from > state.LastSeq {
		return state.Bytes, nil
	}
	// A bucket keeping older revisions (History above 1) holds messages
	// that are no key's record any more.
	history := info.Config.MaxMsgsPerSubject
	for restarts := 0; ; restarts++ {
		pos, gap, err := s.scanFrom(ctx, sh, max(from, 1), state.LastSeq, history, fn)
		if err != nil || !gap {
			return state.Bytes, err
		}
		if restarts == maxScanRestarts {
			return 0, fmt.Errorf("%w: the scan of stream %s lost messages %d times in a row", stores.ErrUnavailable, streamName(sh.bucket), restarts+1)
		}
		from = pos + 1
	}
}

// pullRequest is the body of a CONSUMER.MSG.NEXT request.
type pullRequest struct {
	Batch  int  `json:"batch"`
	NoWait bool `json:"no_wait"`
}

// scanFrom is one consumer's part of scan: it returns the sequence of
// the last message read and whether messages were lost after it.
func (s *Store) scanFrom(ctx context.Context, sh *shard, from, end uint64, history int64, fn func(scanned) bool) (pos uint64, gap bool, err error) {
	pos = from - 1
	cons, err := sh.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "natsstore admin scan",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     sh.prefix + ">",
		InactiveThreshold: scanInactive,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return pos, false, err
	}
	name := cons.CachedInfo().Name
	defer func() {
		// The server deletes it after scanInactive anyway.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		_ = sh.stream.DeleteConsumer(dctx, name)
	}()
	next := "$JS.API.CONSUMER.MSG.NEXT." + streamName(sh.bucket) + "." + name
	pending := cons.CachedInfo().NumPending
	var delivered uint64 // the consumer sequence of the last message
	for pending > 0 {
		pos, pending, gap, err = s.pull(ctx, sh, next, int(min(pending, scanBatch)), pos, &delivered, end, history, fn)
		if err != nil || gap {
			return pos, gap, err
		}
	}
	return pos, false, nil
}

// pull makes one pull of scanFrom's, of batch messages, on a
// subscription of its own (a status left by a pull cannot end the
// next), and returns what the consumer still has pending: 0 when the
// scan is over.
func (s *Store) pull(ctx context.Context, sh *shard, subject string, batch int, pos uint64, delivered *uint64, end uint64, history int64, fn func(scanned) bool) (uint64, uint64, bool, error) {
	inbox := s.nc.NewInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return pos, 0, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	// A pull is bounded by batch messages, each by max_payload.
	_ = sub.SetPendingLimits(-1, -1)
	req, _ := json.Marshal(pullRequest{Batch: batch, NoWait: true})
	if err := s.nc.PublishRequest(subject, inbox, req); err != nil {
		return pos, 0, false, err
	}
	pending := uint64(0)
	for got := 0; got < batch; {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return pos, 0, false, err
		}
		if code := m.Header.Get("Status"); code != "" && len(m.Data) == 0 {
			switch code {
			case "100": // a heartbeat
				continue
			case "404", "408": // no message now: the pull is over
				if got == 0 {
					return pos, 0, false, nil // nothing pending: the scan is over
				}
				return pos, pending, false, nil
			}
			return pos, 0, false, fmt.Errorf("natsstore: pull from stream %s: status %s %s", streamName(sh.bucket), code, m.Header.Get("Description"))
		}
		got++
		md, err := m.Metadata()
		if err != nil {
			return pos, 0, false, fmt.Errorf("natsstore: pull from stream %s: %w", streamName(sh.bucket), err)
		}
		if md.Sequence.Consumer != *delivered+1 {
			return pos, 0, true, nil
		}
		*delivered = md.Sequence.Consumer
		if md.Sequence.Stream > end {
			return pos, 0, false, nil
		}
		pos, pending = md.Sequence.Stream, md.NumPending
		sc := scanned{seq: pos, id: strings.TrimPrefix(m.Subject, sh.prefix), last: pending == 0 || pos >= end}
		sc.e.rev = pos
		if !isMarker(m.Header) {
			if err := decodeValue(&sc.e, m.Data); err != nil {
				return pos, 0, false, fmt.Errorf("%w: subject %s, revision %d", err, m.Subject, pos)
			}
		}
		if history != 1 && sc.e.state != stateNone {
			latest, err := s.read(ctx, record{sh: sh, subj: m.Subject})
			if err != nil {
				return pos, 0, false, err
			}
			if latest.rev != pos {
				sc.e = entry{rev: pos} // an older revision
			}
		}
		if !fn(sc) || sc.last {
			return pos, 0, false, nil
		}
	}
	return pos, pending, false, nil
}

// listCursor is where a List resumes: in shard, after stream sequence
// seq.
type listCursor struct {
	shard int
	seq   uint64
}

const cursorVersion = 1

func (c listCursor) String() string {
	b := []byte{cursorVersion}
	b = binary.AppendUvarint(b, uint64(c.shard))
	b = binary.AppendUvarint(b, c.seq)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *Store) parseCursor(text string) (listCursor, error) {
	bad := fmt.Errorf("%w: %q is not a natsstore List cursor", stores.ErrInvalidArgument, text)
	b, err := base64.RawURLEncoding.DecodeString(text)
	if err != nil || len(b) < 1 || b[0] != cursorVersion {
		return listCursor{}, bad
	}
	b = b[1:]
	shard, k := binary.Uvarint(b)
	if k <= 0 {
		return listCursor{}, bad
	}
	seq, k2 := binary.Uvarint(b[k:])
	if k2 <= 0 || k+k2 != len(b) {
		return listCursor{}, bad
	}
	if shard >= uint64(len(s.shards)) {
		return listCursor{}, fmt.Errorf("%w: the cursor names bucket %d of a store of %d (Shards)", stores.ErrInvalidArgument, shard, len(s.shards))
	}
	return listCursor{shard: int(shard), seq: seq}, nil
}
