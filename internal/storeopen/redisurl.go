package storeopen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/cliflag"
)

// The settings of a Redis server's TLS, as both programs name them.
const (
	RedisCASetting   = "-redis-ca or DEDUP_REDIS_CA"
	RedisCertSetting = "-redis-cert or DEDUP_REDIS_CERT"
	RedisKeySetting  = "-redis-key or DEDUP_REDIS_KEY"
)

// RedisConfig is where and how a program reaches Redis: -redis-addr,
// -redis-cluster and the TLS files.
type RedisConfig struct {
	// Addr is host:port; with Cluster, the comma-separated host:port of
	// some of its nodes. Or a URL, as go-redis's ParseURL reads it:
	// redis://[user[:password]@]host[:port][/db][?option=value...], with
	// rediss:// for TLS; with Cluster, one URL whose addr=host:port
	// parameters name more nodes (ParseClusterURL), or comma-separated
	// URLs with the same scheme and credentials.
	Addr    string
	Cluster bool
	TLS     RedisTLS
}

// RedisTLS are the files of a Redis connection's TLS, for a rediss://
// URL.
type RedisTLS struct {
	// CAFile is a PEM file of the certificate authorities that sign the
	// server's certificate, for a private CA; default: the system's.
	CAFile string

	// CertFile and KeyFile are a PEM client certificate and its key, for
	// a server that asks for one (tls-auth-clients).
	CertFile, KeyFile string
}

// RedisTLSFlags are the flags RegisterFlags defines.
var RedisTLSFlags = []string{"redis-ca", "redis-cert", "redis-key"}

// RegisterFlags defines the flags of f on fs, f's values their defaults:
// -redis-ca, -redis-cert and -redis-key, as both programs name them.
func (f *RedisTLS) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.CAFile, "redis-ca", f.CAFile, "PEM `file` of the authority that signed the Redis server's TLS certificate, for a private CA (with a rediss:// URL)")
	fs.StringVar(&f.CertFile, "redis-cert", f.CertFile, "PEM client certificate `file`, for a Redis server that asks for one (tls-auth-clients; with -redis-key)")
	fs.StringVar(&f.KeyFile, "redis-key", f.KeyFile, "PEM `file` of the key of -redis-cert")
}

// RedisTarget is a RedisConfig that parsed: the go-redis options it
// makes, and what to show of it.
type RedisTarget struct {
	// Display is Addr for people: every URL with its password replaced by
	// "xxxxx" (url.URL.Redacted). Errors, logs and summaries show this,
	// never Addr.
	Display string
	Cluster bool
	TLS     bool

	addrs   []string // where to probe
	single  *redis.Options
	cluster *redis.ClusterOptions
}

// ParseRedis checks c and makes the go-redis options it names. A setting
// that does not parse is a *SettingError that shows no password.
func ParseRedis(c RedisConfig) (*RedisTarget, error) {
	items := cliflag.SplitList(c.Addr)
	if len(items) == 0 {
		return nil, &SettingError{RedisSetting, errors.New("no Redis address")}
	}
	if credentialsOutsideURL(items) {
		// Quote none of it: a URL's password with a ',' in it, split in
		// two, or credentials without a scheme.
		if slices.ContainsFunc(items, isRedisURL) {
			return nil, &SettingError{RedisSetting, errInvalidURL}
		}
		return nil, &SettingError{RedisSetting, errors.New("an address with credentials must be a URL: redis://user:password@host:port (rediss:// for TLS)")}
	}
	if len(items) > 1 && !c.Cluster {
		return nil, &SettingError{RedisSetting, fmt.Errorf("%d addresses (%s) for one Redis: give one, or add -redis-cluster for a Redis Cluster", len(items), RedactRedis(c.Addr))}
	}
	t := &RedisTarget{Display: RedactRedis(c.Addr), Cluster: c.Cluster}
	urls := 0
	for _, a := range items {
		if isRedisURL(a) {
			urls++
			if _, ok := parseURL(a); !ok {
				return nil, &SettingError{RedisSetting, urlError(a, nil)}
			}
		}
	}
	if urls > 0 && urls < len(items) {
		return nil, &SettingError{RedisSetting, fmt.Errorf("%s mixes URLs and host:port addresses: write every node the same way", t.Display)}
	}
	var tlsCfg *tls.Config
	if urls == 0 {
		for _, a := range items {
			if err := checkHostPort(a); err != nil {
				return nil, &SettingError{RedisSetting, err}
			}
		}
		t.addrs = items
		if c.Cluster {
			t.cluster = &redis.ClusterOptions{Addrs: items}
		} else {
			t.single = &redis.Options{Addr: items[0]}
		}
	} else if c.Cluster {
		opts, err := redis.ParseClusterURL(items[0])
		if err != nil {
			return nil, &SettingError{RedisSetting, urlError(items[0], err)}
		}
		if db := urlDB(items[0]); db != "" && db != "0" {
			return nil, &SettingError{RedisSetting, fmt.Errorf("%s names database %s: a Redis Cluster has database 0 only", redactURL(items[0]), db)}
		}
		for _, u := range items[1:] {
			o, err := redis.ParseURL(u)
			if err != nil {
				return nil, &SettingError{RedisSetting, urlError(u, err)}
			}
			if o.Username != opts.Username || o.Password != opts.Password || (o.TLSConfig != nil) != (opts.TLSConfig != nil) {
				return nil, &SettingError{RedisSetting, fmt.Errorf("the URLs of %s differ in scheme or credentials: a Redis Cluster's nodes take the same", t.Display)}
			}
			opts.Addrs = append(opts.Addrs, o.Addr)
		}
		if opts.TLSConfig != nil {
			// Each node is verified by its own host name (tls.Dial's
			// default), not by the first URL's.
			opts.TLSConfig.ServerName = ""
			opts.TLSConfig.MinVersion = tls.VersionTLS12
		}
		t.addrs, t.cluster, tlsCfg = opts.Addrs, opts, opts.TLSConfig
	} else {
		opts, err := redis.ParseURL(items[0])
		if err != nil {
			return nil, &SettingError{RedisSetting, urlError(items[0], err)}
		}
		if opts.Network != "tcp" {
			return nil, &SettingError{RedisSetting, fmt.Errorf("%s: only redis:// and rediss:// URLs are supported", t.Display)}
		}
		if opts.DB < 0 {
			// go-redis SELECTs a positive database only: a negative one
			// would be database 0, silently.
			return nil, &SettingError{RedisSetting, fmt.Errorf("%s names database %d: a database number is 0 or more", t.Display, opts.DB)}
		}
		t.addrs, t.single, tlsCfg = []string{opts.Addr}, opts, opts.TLSConfig
	}
	t.TLS = tlsCfg != nil
	if err := c.TLS.apply(tlsCfg); err != nil {
		return nil, err
	}
	return t, nil
}

// apply adds the CA and the client certificate to cfg, the TLS
// configuration of a rediss:// URL (nil for any other).
func (c RedisTLS) apply(cfg *tls.Config) error {
	if cfg == nil {
		for _, f := range []struct{ file, setting string }{{c.CAFile, RedisCASetting}, {c.CertFile, RedisCertSetting}, {c.KeyFile, RedisKeySetting}} {
			if f.file != "" {
				return &SettingError{f.setting, fmt.Errorf("TLS needs a rediss:// URL in %s", RedisSetting)}
			}
		}
		return nil
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return &SettingError{RedisCASetting, err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return &SettingError{RedisCASetting, fmt.Errorf("no PEM certificate in %s", c.CAFile)}
		}
		cfg.RootCAs = pool
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return &SettingError{RedisCertSetting + " and " + RedisKeySetting, err}
		}
		cfg.Certificates = []tls.Certificate{cert}
	case c.CertFile != "":
		return &SettingError{RedisKeySetting, errors.New("a client certificate needs its key")}
	case c.KeyFile != "":
		return &SettingError{RedisCertSetting, errors.New("a client key needs its certificate")}
	}
	return nil
}

// Options returns the options of one server's client (not a Cluster's),
// a copy, with the opener's timeouts: for a program that makes clients of
// its own on the same server.
func (t *RedisTarget) Options() *redis.Options {
	o := *t.single
	if o.TLSConfig != nil {
		o.TLSConfig = o.TLSConfig.Clone()
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DialTimeout
	}
	return &o
}

// tlsConfig is the TLS configuration of a rediss:// target, nil for
// another.
func (t *RedisTarget) tlsConfig() *tls.Config {
	if t.cluster != nil {
		return t.cluster.TLSConfig
	}
	return t.single.TLSConfig
}

// OpenRedis connects to the Redis (or, with c.Cluster, the Redis Cluster)
// c names, and pings it, as Redis does. It returns the client and the
// parsed target. With a rediss:// URL it makes a TLS handshake first: a
// server that does not complete one (a Redis without TLS) is an
// *UnreachableError holding a *NotTLSError.
func (o Opener) OpenRedis(ctx context.Context, c RedisConfig) (redis.UniversalClient, *RedisTarget, error) {
	t, err := ParseRedis(c)
	if err != nil {
		return nil, nil, err
	}
	var (
		probed  error
		reached string
	)
	for _, a := range t.addrs {
		if probed = ProbeTCP(ctx, "Redis", a, RedisSetting); probed == nil {
			reached = a
			break
		}
	}
	if probed != nil {
		var u *UnreachableError
		if errors.As(probed, &u) && t.Display != strings.Join(t.addrs, ",") {
			u.Addr = t.Display
		}
		return nil, nil, probed
	}
	service := "Redis"
	if t.Cluster {
		service = "Redis Cluster"
	}
	if t.TLS {
		if err := o.probeTLS(ctx, reached, t.tlsConfig()); err != nil {
			return nil, nil, o.unreachable(service, t.Display, RedisSetting, err)
		}
	}
	var client redis.UniversalClient
	if t.Cluster {
		opts := *t.cluster
		opts.ContextTimeoutEnabled = true
		if opts.DialTimeout == 0 {
			opts.DialTimeout = o.dialTimeout()
		}
		if opts.MaxRetries == 0 {
			opts.MaxRetries = 1
		}
		if o.RedisClusterOptions != nil {
			o.RedisClusterOptions(&opts)
		}
		client = redis.NewClusterClient(&opts)
	} else {
		opts := t.Options()
		if o.DialTimeout > 0 {
			opts.DialTimeout = o.DialTimeout
		}
		opts.ContextTimeoutEnabled = true
		opts.DialerRetries = 1
		if opts.MaxRetries == 0 {
			opts.MaxRetries = 1
		}
		if o.RedisOptions != nil {
			o.RedisOptions(opts)
		}
		client = redis.NewClient(opts)
	}
	ping := o.pingTimeout()
	pctx, cancel := context.WithTimeout(ctx, ping)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// Something accepted the connection and said nothing.
			err = fmt.Errorf("no answer within %s", ping)
		}
		return nil, nil, o.unreachable(service, t.Display, RedisSetting, err)
	}
	return client, t, nil
}

// RedactRedis is a -redis-addr value for people: each URL in it with its
// password replaced by "xxxxx", host:port addresses as they are, and
// "(unparsable Redis URL)" for a URL that does not parse.
func RedactRedis(addr string) string {
	items := cliflag.SplitList(addr)
	if credentialsOutsideURL(items) {
		return "(unparsable Redis URL)"
	}
	for i, a := range items {
		if isRedisURL(a) {
			items[i] = redactURL(a)
		}
	}
	return strings.Join(items, ",")
}

// isRedisURL tells a URL from a host:port address.
func isRedisURL(s string) bool { return strings.Contains(s, "://") }

// credentialsOutsideURL reports an item of a -redis-addr list that is
// no URL but holds an '@': credentials without a scheme, or the end of
// a URL's password that held a ',' (the list is split at commas), whose
// beginning may even parse as a URL of its own (redis://user:1234 is
// host "user", port 1234). No part of such an address can be shown.
func credentialsOutsideURL(items []string) bool {
	for _, a := range items {
		if !isRedisURL(a) && strings.Contains(a, "@") {
			return true
		}
	}
	return false
}

func redactURL(s string) string {
	u, ok := parseURL(s)
	if !ok {
		return "(unparsable Redis URL)"
	}
	return u.Redacted()
}

// parseURL parses s, and refuses a URL with an '@' past its host: a
// password holding a '/', '?' or '#' that was not percent-encoded, whose
// rest url.Parse would take for the path, the query or the fragment, and
// show.
func parseURL(s string) (*url.URL, bool) {
	u, err := url.Parse(s)
	if err != nil || strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
		return nil, false
	}
	return u, true
}

// urlDB is the database a URL's path names ("" for none).
func urlDB(s string) string {
	u, ok := parseURL(s)
	if !ok {
		return ""
	}
	return strings.Trim(u.Path, "/")
}

// errInvalidURL is the error of a URL that does not parse, which quotes
// none of it.
var errInvalidURL = errors.New("not a valid URL: write redis://user:password@host:port/db (rediss:// for TLS), with any of ,:/?#[]@% in the user or password percent-encoded")

// urlError is go-redis's error for a URL, without the URL: url.Parse's
// errors quote it whole, password and all, and their detail may quote a
// part of the password (a '#' or '/' in it ends the host early).
func urlError(raw string, err error) error {
	if _, ok := parseURL(raw); !ok {
		return errInvalidURL
	}
	return fmt.Errorf("%s: %w", redactURL(raw), err)
}

// checkHostPort checks a host:port address (one without credentials:
// see credentialsOutsideURL).
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%q is neither host:port nor a redis:// or rediss:// URL", a)
	}
	return nil
}
