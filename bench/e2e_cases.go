package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/redisstore"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

// e2eCase is one way the router runs.
type e2eCase struct {
	name, note string
	store      string // "redis", "postgres", "memory"; "" for none
	async      bool
	// tx runs ModeTransactional (the store's inbox: the record is
	// inserted in the transaction the handler writes in).
	tx bool
	// naive is the hand-rolled peer: SET <key> 1 NX PX <retention> on the
	// store's go-redis client before the handler, skipping the message
	// when the key exists, nothing done when the handler fails.
	naive bool
	// deduplicator runs Watermill's Deduplicator instead of this
	// middleware.
	deduplicator bool
	// write: the handler INSERTs a row into a PostgreSQL table (the
	// shape of the example's loyalty handler) instead of doing nothing.
	write bool
	// ownTx: the writing handler opens a transaction of its own for its
	// INSERT (BEGIN, INSERT, COMMIT), as a handler writing more than one
	// row would.
	ownTx bool
	// base is the case this one is measured against: plain, or
	// plain_write for the writing cases.
	base string
	// idOnly keys the middleware by the message id alone, as the naive
	// case is keyed, instead of the id and the business key.
	idOnly bool
	// diagnostic cases have no goal.
	diagnostic bool
}

// usesRedis and usesPG say which servers' CPU a case's messages cost.
func (c e2eCase) usesRedis() bool { return c.store == "redis" || c.naive }
func (c e2eCase) usesPG() bool    { return c.store == "postgres" || c.write }

var (
	casePlain         = e2eCase{name: "plain", note: "router without dedup"}
	caseNaive         = e2eCase{name: "naive_setnx", note: "hand-rolled: SET msg-id 1 NX PX retention on the same go-redis client, skip if set; no release, no lease, no outputs", naive: true, base: "plain"}
	caseRedis         = e2eCase{name: "dedup_redis", note: "ModeLease on redisstore, id + business key", store: "redis", base: "plain"}
	caseAsyncRedis    = e2eCase{name: "dedup_async_redis", note: "ModeAsyncComplete on redisstore", store: "redis", async: true, base: "plain"}
	caseAsyncRedisID  = e2eCase{name: "dedup_async_redis_id", note: "diagnostic: ModeAsyncComplete on redisstore keyed by the message id alone, as naive_setnx is (one key a call, a SET NX GET claim)", store: "redis", async: true, idOnly: true, diagnostic: true, base: "plain"}
	casePostgres      = e2eCase{name: "dedup_postgres", note: "ModeLease on sqlstore PostgreSQL, id + business key", store: "postgres", base: "plain"}
	caseAsyncPostgres = e2eCase{name: "dedup_async_postgres", note: "ModeAsyncComplete on sqlstore PostgreSQL", store: "postgres", async: true, base: "plain"}
	caseMemstore      = e2eCase{name: "dedup_memstore", note: "diagnostic: ModeLease on memstore (no round trip)", store: "memory", diagnostic: true, base: "plain"}
	caseDeduplicator  = e2eCase{name: "watermill_deduplicator", note: "Watermill's Deduplicator (in-process map, message id)", deduplicator: true, diagnostic: true, base: "plain"}

	casePlainWrite      = e2eCase{name: "plain_write", note: "router without dedup, the handler INSERTs one row into PostgreSQL", write: true, base: "plain"}
	caseAsyncRedisWrite = e2eCase{name: "dedup_async_redis_write", note: "the writing handler behind ModeAsyncComplete on redisstore", store: "redis", async: true, write: true, base: "plain_write"}
	casePlainWriteTx    = e2eCase{name: "plain_write_tx", note: "diagnostic: router without dedup, the handler's INSERT in a transaction of its own (BEGIN, INSERT, COMMIT)", write: true, ownTx: true, diagnostic: true, base: "plain_write"}
	caseTxWrite         = e2eCase{name: "tx_postgres_write", note: "the writing handler behind ModeTransactional on sqlstore PostgreSQL: its INSERT and the record in one transaction", store: "postgres", tx: true, write: true, base: "plain_write"}

	// e2eBrokerNames are the brokers in the order they run.
	e2eBrokerNames = []string{"kfake1", "kfake16", "rabbitmq1", "rabbitmq16", "sqlpg"}

	sequentialCases = []e2eCase{casePlain, caseNaive, caseRedis, caseAsyncRedis, caseAsyncRedisID, caseMemstore, caseDeduplicator}
	concurrentCases = []e2eCase{casePlain, caseNaive, caseRedis, caseAsyncRedis, caseAsyncRedisID, casePostgres, caseAsyncPostgres, caseMemstore, caseDeduplicator,
		casePlainWrite, casePlainWriteTx, caseAsyncRedisWrite, caseTxWrite}
	sqlCases = []e2eCase{casePlain, caseNaive, caseRedis, caseAsyncRedis, caseAsyncRedisID}
)

func e2eCaseNames() []string {
	var names []string
	for _, c := range concurrentCases {
		if c != casePlain {
			names = append(names, c.name)
		}
	}
	return names
}

// e2eStores are the stores the cases run on, opened once for the section.
type e2eStores struct {
	byName  map[string]stores.Store
	missing map[string]string // why a store could not be opened
	redis   *anystore.OpenedStore
	// redisPrefix is the store's key prefix; the naive case's keys are
	// under it too, so that the teardown deletes them.
	redisPrefix string
	// pg is the PostgreSQL store's database (application_name pgAppName,
	// so that its server processes can be found), and ledger the table
	// the writing handler INSERTs into.
	pg     *sql.DB
	ledger string
}

func openE2EStores(ctx context.Context) (*e2eStores, func(), error) {
	s := &e2eStores{byName: map[string]stores.Store{}, missing: map[string]string{}, redisPrefix: "dedupbench:e2e:" + runID() + ":"}
	var cleanups []func(context.Context) error
	cleanup := func() {
		for _, c := range slices.Backward(cleanups) {
			_ = c(context.Background())
		}
	}
	for _, p := range []struct {
		name   string
		params anystore.StoreParams
	}{
		{"memory", anystore.StoreParams{Kind: anystore.StoreMemory}},
		{"redis", anystore.StoreParams{
			Kind:     anystore.StoreRedis,
			Name:     s.redisPrefix,
			PoolSize: 64,
			Teardown: true,
			Redis:    redisstore.Config{SkipServerCheck: true},
		}},
		{"postgres", anystore.StoreParams{
			Kind:         anystore.StorePostgres,
			DSN:          pgBenchDSN(),
			Name:         "dedup_bench_e2e_" + runID(),
			PoolSize:     16,
			CreateSchema: true,
			Teardown:     true,
		}},
	} {
		o, c, err := anystore.OpenStore(ctx, p.params)
		if err != nil {
			var u *anystore.UnreachableError
			if errors.As(err, &u) {
				s.missing[p.name] = err.Error()
				continue
			}
			cleanup()
			return nil, nil, err
		}
		cleanups = append(cleanups, c)
		s.byName[p.name] = o.Store
		switch p.name {
		case "redis":
			s.redis = o
		case "postgres":
			s.pg = o.DB
			// Keep every connection for the section: a server process
			// that exits takes its CPU figures with it.
			s.pg.SetConnMaxIdleTime(0)
			s.pg.SetConnMaxLifetime(0)
			s.ledger = "dedup_bench_ledger_" + runID()
			if _, err := s.pg.ExecContext(ctx, "CREATE TABLE "+s.ledger+
				" (id bigserial PRIMARY KEY, message_uuid text NOT NULL, payment_id text NOT NULL, points int NOT NULL)"); err != nil {
				cleanup()
				return nil, nil, err
			}
			cleanups = append(cleanups, func(ctx context.Context) error {
				_, err := s.pg.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.ledger)
				return err
			})
		}
	}
	return s, cleanup, nil
}

// available says whether the stores c needs are open.
func (st *e2eStores) available(c e2eCase) bool {
	if _, ok := st.missing[c.store]; ok {
		return false
	}
	if c.naive && st.redis == nil {
		return false
	}
	if c.write && st.pg == nil {
		return false
	}
	return true
}

// meter returns the CPU meter of c's servers.
func (st *e2eStores) meter(c e2eCase) *cpuMeter {
	m := &cpuMeter{}
	if c.usesRedis() && st.redis != nil {
		m.redis = st.redis.Redis
	}
	if c.usesPG() && st.pg != nil {
		m.pg = st.pg
	}
	return m
}

// payment is the event the messages carry.
type payment struct {
	PaymentID string `json:"payment_id"`
}

// handler returns the handler c runs: nothing, or one INSERT into the
// ledger, in the inbox's transaction when the message has one.
func (st *e2eStores) handler(c e2eCase) message.HandlerFunc {
	if !c.write {
		return func(*message.Message) ([]*message.Message, error) { return nil, nil }
	}
	insert := "INSERT INTO " + st.ledger + " (message_uuid, payment_id, points) VALUES ($1, $2, 1)"
	return func(msg *message.Message) ([]*message.Message, error) {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return nil, err
		}
		ctx := msg.Context()
		var err error
		if tx, ok := sqlstore.TxFromContext(ctx); ok {
			_, err = tx.ExecContext(ctx, insert, msg.UUID, p.PaymentID)
		} else if c.ownTx {
			var tx *sql.Tx
			if tx, err = st.pg.BeginTx(ctx, nil); err != nil {
				return nil, err
			}
			if _, err = tx.ExecContext(ctx, insert, msg.UUID, p.PaymentID); err != nil {
				_ = tx.Rollback()
				return nil, err
			}
			err = tx.Commit()
		} else {
			_, err = st.pg.ExecContext(ctx, insert, msg.UUID, p.PaymentID)
		}
		return nil, err
	}
}

// naiveSetNX is the hand-rolled peer of the middleware: one SET NX PX on
// the message id before the handler, the message skipped (acked) when the
// key is there; a failed handler leaves the key set, a failed SET nacks.
func naiveSetNX(client redis.UniversalClient, prefix string, retention time.Duration) message.HandlerMiddleware {
	px := retention.Milliseconds()
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			err := client.Do(msg.Context(), "set", prefix+msg.UUID, 1, "nx", "px", px).Err()
			if errors.Is(err, redis.Nil) {
				return nil, nil // done before: skip
			}
			if err != nil {
				return nil, err
			}
			return h(msg)
		}
	}
}

// e2eRun is what one run measured.
type e2eRun struct {
	rate            float64 // messages per second, first handled to last
	claim, complete time.Duration
	// cpu is the CPU time a message cost: this process's, and Redis's
	// and the PostgreSQL backends' when the case uses them.
	cpu, redisCPU, pgCPU time.Duration
	hasRedis, hasPG      bool
	// duplicates counts the messages the middleware found done.
	duplicates int64
	// inChain and gap are, on a sequential broker, the median time a
	// message spent in the middleware and handler, and the median time
	// from one message's return to the next one's arrival (the ack and
	// the delivery): where the time a message takes goes.
	inChain, gap time.Duration
	// inChainMean and gapMean are their means: the rate's share of them,
	// slow messages included.
	inChainMean, gapMean time.Duration
}

// publish publishes n messages to topic, message ids prefix-0 to
// prefix-(n-1), each with its payment id.
func publish(b *e2eBroker, topic, prefix string, n int) error {
	for i := 0; i < n; i += 100 {
		batch := make([]*message.Message, 0, 100)
		for j := i; j < min(i+100, n); j++ {
			batch = append(batch, message.NewMessage(prefix+"-"+strconv.Itoa(j), []byte(`{"payment_id":"P`+prefix+strconv.Itoa(j)+`"}`)))
		}
		if err := b.pub.Publish(topic, batch...); err != nil {
			return err
		}
	}
	return nil
}

// consumeRate publishes b.n messages to a fresh topic and consumes them
// (see consume).
func consumeRate(ctx context.Context, b *e2eBroker, mw message.HandlerMiddleware, h message.HandlerFunc, meter *cpuMeter, profile string) (e2eRun, error) {
	run := runID()
	topic := b.topic(run)
	sub, err := b.newSub(run)
	if err != nil {
		return e2eRun{}, err
	}
	// Subscribe first where the broker needs a queue or group to exist.
	if s, ok := sub.(message.SubscribeInitializer); ok {
		if err := s.SubscribeInitialize(topic); err != nil {
			return e2eRun{}, err
		}
	}
	if err := publish(b, topic, run, b.n); err != nil {
		return e2eRun{}, err
	}
	return consume(ctx, b, sub, topic, run, b.n, mw, h, meter, profile)
}

// consume runs a router that consumes n messages of topic from sub, each
// through mw (when not nil) and h, and returns messages per second from
// the first message through the chain to the last — the broker's start
// (a consumer group's join, say) is not in it — and the CPU time a
// message cost over the same span. A message counts once the chain
// returns without an error: a duplicate counts too, without reaching h.
// With -caseprofile, the router's run is profiled as profile.
func consume(ctx context.Context, b *e2eBroker, sub message.Subscriber, topic, run string, n int, mw message.HandlerMiddleware, h message.HandlerFunc, meter *cpuMeter, profile string) (e2eRun, error) {
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return e2eRun{}, err
	}
	chain := h
	if mw != nil {
		chain = mw(h)
	}
	var handled atomic.Int64
	var first atomic.Pointer[time.Time]
	var s0, s1 cpuSample
	servers0 := make(chan struct{})
	done := make(chan struct{})
	// On a sequential broker, when each message entered and left the
	// chain: the time in it, and the broker's gap from one message's
	// return (its ack) to the next one's arrival.
	var enter, leave []time.Time
	var entered atomic.Int64
	if b.sequential() {
		enter, leave = make([]time.Time, n+1), make([]time.Time, n+1)
	}
	counted := func(msg *message.Message) error {
		var i int64
		if enter != nil {
			if i = entered.Add(1); i <= int64(n) {
				enter[i] = time.Now()
			}
		}
		if _, err := chain(msg); err != nil {
			return err
		}
		if enter != nil && i <= int64(n) {
			leave[i] = time.Now()
		}
		switch handled.Add(1) {
		case 1:
			t := time.Now()
			s0.self = selfCPU()
			first.Store(&t)
			// The servers' figures take a round trip each: off the
			// message's path.
			go func() {
				meter.servers(ctx, &s0)
				close(servers0)
			}()
		case int64(n):
			s1.self = selfCPU()
			close(done)
		}
		return nil
	}
	for i := range b.handlers {
		r.AddNoPublisherHandler("bench-"+run+"-"+strconv.Itoa(i), topic, sub, counted)
	}
	stopProfile := profileRun(profile)
	defer stopProfile()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	select {
	case <-done:
	case err := <-runErr:
		return e2eRun{}, fmt.Errorf("router stopped: %v", err)
	case <-time.After(5 * time.Minute):
		_ = r.Close()
		return e2eRun{}, fmt.Errorf("consumed %d of %d messages in 5 minutes", handled.Load(), n)
	}
	elapsed := time.Duration(0)
	if f := first.Load(); f != nil { // nil only if message 1's chain has not got that far
		elapsed = time.Since(*f)
	}
	stopProfile()
	meter.servers(ctx, &s1)
	<-servers0
	run1 := e2eRun{rate: float64(n-1) / elapsed.Seconds()}
	if enter != nil && entered.Load() == int64(n) {
		// Only when no message ran twice (a nack), so that the i-th
		// entry is the i-th message.
		var in, gap []time.Duration
		for i := 1; i <= n; i++ {
			in = append(in, leave[i].Sub(enter[i]))
			if i > 1 {
				gap = append(gap, enter[i].Sub(leave[i-1]))
			}
		}
		run1.inChainMean, run1.gapMean = mean(in), mean(gap)
		run1.inChain, _ = percentiles(in)
		run1.gap, _ = percentiles(gap)
	}
	used, uerr := meter.used(s0, s1)
	per := func(d time.Duration) time.Duration { return d / time.Duration(max(n-1, 1)) }
	run1.cpu, run1.redisCPU, run1.pgCPU = per(used.self), per(used.redis), per(used.pg)
	run1.hasRedis, run1.hasPG = used.hasRedis, used.hasPG
	_ = r.Close()
	<-runErr
	if uerr != nil {
		fmt.Fprintf(os.Stderr, "bench: e2e %s: server CPU not read: %v\n", b.name, uerr)
		run1.hasRedis, run1.hasPG = false, false
	}
	return run1, nil
}

// middlewareFor returns the middleware c runs (nil for none), with
// scope as its Scope ("" for the handler's name), and what releases it.
func (st *e2eStores) middlewareFor(c e2eCase, scope string, lat *storeLatencies) (message.HandlerMiddleware, func(context.Context) error, error) {
	nothing := func(context.Context) error { return nil }
	switch {
	case c.naive:
		return naiveSetNX(st.redis.Redis, st.redisPrefix+"naive:", dedup.DefaultRetention), nothing, nil
	case c.deduplicator:
		// Its cleanup goroutine cannot be stopped (it runs on
		// context.Background()); one is left per run.
		d := &wmw.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
		return d.Middleware, nothing, nil
	case c.store == "":
		return nil, nothing, nil
	}
	mode := dedup.ModeLease
	switch {
	case c.async:
		mode = dedup.ModeAsyncComplete
	case c.tx:
		mode = dedup.ModeTransactional
	}
	key := keyfuncs.All(
		keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
		keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
	)
	if c.idOnly {
		key = keyfuncs.Prefix("msg:", keyfuncs.MessageID())
	}
	mw, err := middleware.New(middleware.Config{
		Mode:   mode,
		Store:  st.byName[c.store],
		Scope:  scope,
		Key:    key,
		Policy: dedup.Policy{Metrics: lat},
	})
	if err != nil {
		return nil, nil, err
	}
	// Close waits for the Completes still in flight, so their latencies
	// are counted.
	return mw.Middleware, mw.Close, nil
}

// runCase runs the router on b once as c says.
func runCase(ctx context.Context, b *e2eBroker, c e2eCase, st *e2eStores, lat *storeLatencies) (e2eRun, error) {
	mw, closeMW, err := st.middlewareFor(c, "", lat)
	if err != nil {
		return e2eRun{}, err
	}
	lat.reset()
	r, err := consumeRate(ctx, b, mw, st.handler(c), st.meter(c), b.name+"_"+c.name)
	if cerr := closeMW(ctx); err == nil {
		err = cerr
	}
	r.claim, r.complete = lat.means()
	r.duplicates = lat.duplicates.Load()
	return r, err
}

// caseProfiles, when set (-caseprofile), is the directory that gets a
// CPU profile of each e2e run: <broker>_<case>_<n>.prof.
var caseProfiles string

// profileRun starts the CPU profile of a run named name, if asked, and
// returns what stops it.
// The stop function may be called more than once.
func profileRun(name string) func() {
	if caseProfiles == "" || name == "" {
		return func() {}
	}
	for i := 1; ; i++ {
		path := filepath.Join(caseProfiles, fmt.Sprintf("%s_%d.prof", name, i))
		if _, err := os.Stat(path); err == nil {
			continue
		}
		f, err := os.Create(path)
		if err == nil {
			if err = pprof.StartCPUProfile(f); err != nil {
				_ = f.Close()
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -caseprofile: %v\n", err)
			return func() {}
		}
		var once sync.Once
		return func() {
			once.Do(func() {
				pprof.StopCPUProfile()
				_ = f.Close()
			})
		}
	}
}

// storeLatencies records the middleware's Claim and Complete latencies
// (their sums and counts: a mean is all it reports, and the message's
// path should pay no lock for it), and counts its duplicates.
type storeLatencies struct {
	claimSum, claimN, completeSum, completeN atomic.Int64
	duplicates                               atomic.Int64
}

func (l *storeLatencies) Observe(_ string, o dedup.Outcome) {
	if o == dedup.OutcomeDuplicate {
		l.duplicates.Add(1)
	}
}

func (l *storeLatencies) ObserveStore(_, op string, d time.Duration, _ error) {
	switch op {
	case dedup.OpClaim, dedup.OpBegin:
		l.claimSum.Add(int64(d))
		l.claimN.Add(1)
	case dedup.OpComplete, dedup.OpCommit:
		l.completeSum.Add(int64(d))
		l.completeN.Add(1)
	}
}

func (l *storeLatencies) reset() {
	l.claimSum.Store(0)
	l.claimN.Store(0)
	l.completeSum.Store(0)
	l.completeN.Store(0)
	l.duplicates.Store(0)
}

// means returns the mean Claim and Complete latencies (Begin and Commit
// in ModeTransactional): what a sequential consumer waits per message.
func (l *storeLatencies) means() (claim, complete time.Duration) {
	avg := func(sum, n *atomic.Int64) time.Duration {
		if n.Load() == 0 {
			return 0
		}
		return time.Duration(sum.Load() / n.Load())
	}
	return avg(&l.claimSum, &l.claimN), avg(&l.completeSum, &l.completeN)
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
