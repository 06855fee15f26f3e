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
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/internal/natsclean"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/natsstore"
)

// natsKind is natsstore's KV buckets on NATS JetStream.
var natsKind = &Kind{
	Name:    "nats",
	Service: "NATS",
	flags: func(fs *flag.FlagSet, s *Settings) {
		n := &s.NATS
		fs.StringVar(&n.URL, "nats-url", firstOf(n.URL, DefaultNATSURL), "NATS `URL` (comma-separated: servers of one cluster); "+
			"nats://user:password@host:port or nats://token@host:port carry credentials, tls:// asks for TLS")
		fs.StringVar(&n.Bucket, "nats-bucket", n.Bucket,
			"the store's KV bucket, Config.Bucket (default \""+natsstore.DefaultBucket+"\", \"router_example_<run id>\" with -run-id)")
		fs.IntVar(&n.Shards, "nats-shards", n.Shards, "the store's Config.Shards: its records are in the buckets <bucket>-0 ... <bucket>-<n-1>")
		n.Auth.RegisterFlags(fs)
	},
	runName: func(runID string) string { return "router_example_" + runID },
	open:    openNATSStore,
}

// NATSSettings are where NATS is and how to connect to it and, with
// Request.Admin, which buckets the store keeps its records in.
type NATSSettings struct {
	// URL is -nats-url: comma-separated URLs of one cluster.
	URL  string
	Auth NATSAuth

	// Bucket is the store's Config.Bucket (-nats-bucket): its name when
	// Request.Name is empty; empty: the run's of -run-id, else the
	// store's default. Shards is its Config.Shards (-nats-shards),
	// with Request.Admin.
	Bucket string
	Shards int
}

// openNATSStore opens the store: with Request.Admin, its buckets as they
// are (natsstore.Open: no bucket created, none refused for its MaxAge).
func openNATSStore(ctx context.Context, o Opener, r Request, out *Opened) error {
	s := r.Settings
	cfg, err := configOf[natsstore.Config](out.Kind, r)
	if err != nil {
		return err
	}
	name := r.name(out.Kind, s.NATS.Bucket)
	if name != "" {
		cfg.Bucket = name
	}
	if r.Admin {
		cfg.Shards, cfg.MaxLease = s.NATS.Shards, s.PurgeGrace
		if err := cfg.Validate(); err != nil {
			return &SettingError{Setting: "-nats-bucket, -nats-shards, -purge-grace", Err: err}
		}
	}
	nc, err := o.NATS(ctx, s.NATS.URL, s.NATS.Auth)
	if err != nil {
		return err
	}
	out.NATS, out.Addr = nc, RedactNATSURL(s.NATS.URL)
	out.onClose(func(context.Context) error { nc.Close(); return nil })
	buckets := cfg.Buckets()
	out.Name, out.Records = buckets[0], "bucket "+buckets[0]
	if len(buckets) > 1 {
		out.Name, out.Records = cfg.Bucket, "buckets "+strings.Join(buckets, ", ")
	}
	if name != "" {
		// Set before the store is made: Close with RemoveOnClose deletes
		// the buckets New made before it failed.
		out.remove = func(ctx context.Context) error { return natsclean.DeleteBuckets(ctx, nc, cfg) }
		out.Removal = "delete " + out.Records
	}
	if r.Admin {
		st, err := natsstore.Open(ctx, nc, cfg)
		if err != nil {
			if errors.Is(err, natsstore.ErrNoBucket) {
				return fmt.Errorf("%v on NATS %s (change -nats-bucket, or -nats-shards: a store of n shards keeps its records in <bucket>-0 ... <bucket>-<n-1>)",
					err, out.Addr)
			}
			return fmt.Errorf("cannot open NATS %s, %s: %w", out.Addr, out.Records, err)
		}
		out.setStore(st)
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, o.pingTimeout())
	defer cancel()
	st, err := natsstore.New(pctx, nc, cfg)
	if err != nil {
		if errors.Is(err, stores.ErrUnavailable) {
			return &UnreachableError{Service: "NATS JetStream", Addr: out.Addr, Setting: NATSSetting, Err: err}
		}
		return err
	}
	out.setStore(st)
	return nil
}

// NATS: the connection of the nats kind and of router_example's NATS
// broker, with its credentials and TLS.

// NATSSetting is the setting that moves NATS, as both programs name it.
const NATSSetting = "-nats-url or NATS_URL"

// NATSAuthSetting is what holds the credentials a NATS server may
// refuse.
const NATSAuthSetting = "-nats-url or NATS_URL, -nats-user, -nats-password, -nats-token, -nats-creds or -nats-nkey"

// NATSAuth is how a program proves who it is to NATS, and which
// certificates it trusts, besides what the URL says: a URL may carry a
// user and password (nats://user:password@host:4222) or a token
// (nats://token@host:4222), and tls:// asks for TLS (as does a server
// that requires it).
type NATSAuth struct {
	// User and Password: -nats-user, -nats-password.
	User, Password string
	// Token: -nats-token.
	Token string
	// CredsFile is a credentials file, a user JWT and its nkey seed, of a
	// server in operator (JWT) mode: -nats-creds.
	CredsFile string
	// NKeyFile is a file holding a user's nkey seed (SU...), of a server
	// whose users are nkeys: -nats-nkey.
	NKeyFile string
	// CAFile holds the PEM certificates of the authorities that sign the
	// server's certificate, for a private CA: -nats-ca.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// a server that asks for one (tls { verify: true }): -nats-cert,
	// -nats-key. They prove who connects beside the user's credentials
	// (or, with verify_and_map, as them).
	CertFile, KeyFile string
}

// NATSAuthFlags are the flags RegisterFlags defines.
var NATSAuthFlags = []string{"nats-user", "nats-password", "nats-token", "nats-creds", "nats-nkey", "nats-ca", "nats-cert", "nats-key"}

// RegisterFlags defines the flags of a on fs, a's values their defaults:
// -nats-user, -nats-password, -nats-token, -nats-creds, -nats-nkey,
// -nats-ca, -nats-cert and -nats-key, as both programs name them.
func (a *NATSAuth) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.User, "nats-user", a.User, "NATS user (with -nats-password; or in the URL, nats://user:password@host:port)")
	fs.StringVar(&a.Password, "nats-password", a.Password, "NATS password")
	fs.StringVar(&a.Token, "nats-token", a.Token, "NATS token (or in the URL, nats://token@host:port)")
	fs.StringVar(&a.CredsFile, "nats-creds", a.CredsFile, "NATS credentials `file` (a user JWT and its nkey seed)")
	fs.StringVar(&a.NKeyFile, "nats-nkey", a.NKeyFile, "`file` holding a NATS user's nkey seed")
	fs.StringVar(&a.CAFile, "nats-ca", a.CAFile, "PEM `file` of the authority that signed the NATS server's TLS certificate, for a private CA (with a tls:// URL)")
	fs.StringVar(&a.CertFile, "nats-cert", a.CertFile, "PEM client certificate `file`, for a NATS server that asks for one (tls verify; with -nats-key)")
	fs.StringVar(&a.KeyFile, "nats-key", a.KeyFile, "PEM `file` of the key of -nats-cert")
}

// Options returns the nats.go options of a, or a *SettingError for
// settings that contradict each other or a file that cannot be read.
// It reads the files now, so that their errors name the setting.
func (a NATSAuth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	methods := 0
	if a.User != "" || a.Password != "" {
		if a.User == "" {
			return nil, &SettingError{"-nats-password", errors.New("a password needs a user: set -nats-user too")}
		}
		opts = append(opts, nats.UserInfo(a.User, a.Password))
		methods++
	}
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
		methods++
	}
	if a.CredsFile != "" {
		if _, err := os.Stat(a.CredsFile); err != nil {
			return nil, &SettingError{"-nats-creds", err}
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
		methods++
	}
	if a.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, &SettingError{"-nats-nkey", err}
		}
		opts = append(opts, o)
		methods++
	}
	if methods > 1 {
		return nil, &SettingError{"-nats-user, -nats-token, -nats-creds, -nats-nkey", errors.New("give one way to authenticate, not several")}
	}
	if a.CAFile != "" {
		pem, err := os.ReadFile(a.CAFile)
		if err != nil {
			return nil, &SettingError{"-nats-ca", err}
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, &SettingError{"-nats-ca", fmt.Errorf("%s holds no PEM certificate", a.CAFile)}
		}
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	switch {
	case a.CertFile != "" && a.KeyFile != "":
		// Loaded now, so that a bad pair names the settings; nats.go
		// loads it again on each connection.
		if _, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile); err != nil {
			return nil, &SettingError{"-nats-cert and -nats-key", err}
		}
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	case a.CertFile != "":
		return nil, &SettingError{"-nats-key", errors.New("a client certificate needs its key")}
	case a.KeyFile != "":
		return nil, &SettingError{"-nats-cert", errors.New("a client key needs its certificate")}
	}
	return opts, nil
}

// RedactNATSURL returns the NATS URL (or comma-separated URLs) raw
// without what it may hold of credentials: a user and password, or a
// token, which NATS URLs carry where a user goes. What does not parse is
// "(unparsable URL)".
func RedactNATSURL(raw string) string {
	var out []string
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if !strings.Contains(part, "://") {
			part = "nats://" + part // as nats.go reads a bare host:port
		}
		u, err := url.Parse(part)
		if err != nil || u.Host == "" {
			return "(unparsable URL)"
		}
		u.User = nil
		out = append(out, u.String())
	}
	return strings.Join(out, ",")
}

// natsHostPorts returns the host:port of each URL of raw (4222 when a
// URL has no port).
func natsHostPorts(raw string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if !strings.Contains(part, "://") {
			part = "nats://" + part
		}
		u, err := url.Parse(part)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%q is not a NATS URL", RedactNATSURL(part))
		}
		port := u.Port()
		if port == "" {
			port = "4222"
		}
		out = append(out, net.JoinHostPort(u.Hostname(), port))
	}
	return out, nil
}

// NATS connects to the NATS server(s) of rawURL (comma-separated URLs of
// one cluster) with auth and then opts, after probing that one of them
// listens (nats.go would otherwise wait out its own timeouts); o's
// NATSOptions come before opts. It never
// names a password or a token: errors show the URL without credentials.
// A URL that does not parse, or auth settings that contradict each
// other, are a *SettingError; a server that does not answer, refuses the
// credentials or presents a certificate the program does not trust, an
// *UnreachableError naming -nats-url (and what to check).
func (o Opener) NATS(ctx context.Context, rawURL string, auth NATSAuth, opts ...nats.Option) (*nats.Conn, error) {
	addr := RedactNATSURL(rawURL)
	hostPorts, err := natsHostPorts(rawURL)
	if err != nil {
		return nil, &SettingError{NATSSetting, err}
	}
	authOpts, err := auth.Options()
	if err != nil {
		return nil, err
	}
	var probed error
	for _, hp := range hostPorts {
		if probed = ProbeTCP(ctx, "NATS", hp, NATSSetting); probed == nil {
			break
		}
	}
	if probed != nil {
		var ue *UnreachableError
		if errors.As(probed, &ue) {
			ue.Addr = addr
		}
		return nil, probed
	}
	all := append([]nats.Option{nats.Timeout(o.dialTimeout())}, authOpts...)
	all = append(all, o.NATSOptions...)
	nc, err := nats.Connect(rawURL, append(all, opts...)...)
	if err != nil {
		return nil, natsConnectError(addr, err, redactor(rawURL, auth), auth.usesTLS(rawURL))
	}
	return nc, nil
}

// usesTLS reports whether a connection to rawURL with a is meant to
// use TLS: a tls:// URL, or a CA or a client certificate given.
func (a NATSAuth) usesTLS(rawURL string) bool {
	return strings.Contains(rawURL, "tls://") || a.CAFile != "" || a.CertFile != ""
}

// natsConnectError explains a failed connection: a refusal of the
// credentials, a certificate not trusted, or nothing that answered.
func natsConnectError(addr string, err error, redact func(string) string, tlsConfigured bool) error {
	err = redactedError{err, redact}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid):
		return &UnreachableError{Service: "NATS", Addr: addr, Setting: NATSSetting, Err: fmt.Errorf("%w (the server's TLS certificate is not trusted: give the authority that signed it with -nats-ca)", err)}
	case errors.Is(err, nats.ErrSecureConnRequired):
		return &UnreachableError{Service: "NATS", Addr: addr, Setting: NATSSetting, Err: fmt.Errorf("%w (use a tls:// URL)", err)}
	case strings.Contains(err.Error(), "remote error: tls:"), tlsConfigured && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)):
		// The server's TLS alert ("bad certificate", "certificate
		// required", "unknown certificate authority"): it checks client
		// certificates, and refused this one, or its absence. From TLS
		// 1.3 on the client's handshake ends before the server has seen
		// its certificate, and the alert may arrive as a connection
		// the server closed, under the client's first write.
		return &UnreachableError{Service: "NATS", Addr: addr, Setting: "-nats-cert and -nats-key", Check: "client certificate its CA signed", Err: tlsRefusal{err}}
	}
	if natsRefusal(err) != nil {
		return &UnreachableError{Service: "NATS", Addr: addr, Setting: NATSAuthSetting, Check: "credentials", Err: err}
	}
	return &UnreachableError{Service: "NATS", Addr: addr, Setting: NATSSetting, Err: err}
}

// natsRefusal returns the refusal of a NATS server found in err: its
// authorization violation, or a credential that expired or was revoked.
func natsRefusal(err error) error {
	var tr tlsRefusal
	if errors.As(err, &tr) {
		return tr
	}
	for _, target := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired, nats.ErrPermissionViolation} {
		if errors.Is(err, target) {
			return target
		}
	}
	return nil
}

// tlsRefusal is a NATS server's TLS alert, which refused the client's
// certificate.
type tlsRefusal struct{ err error }

func (e tlsRefusal) Error() string {
	var op *net.OpError
	if errors.As(e.err, &op) {
		return op.Error() // "remote error: tls: bad certificate"
	}
	return e.err.Error()
}

func (e tlsRefusal) Unwrap() error { return e.err }

// redactor returns a function that removes the secrets of rawURL and
// auth from a text: nats.go's errors may quote what it was given.
func redactor(rawURL string, auth NATSAuth) func(string) string {
	var secrets []string
	for _, part := range strings.Split(rawURL, ",") {
		if !strings.Contains(part, "://") {
			part = "nats://" + strings.TrimSpace(part)
		}
		if u, err := url.Parse(strings.TrimSpace(part)); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				secrets = append(secrets, p)
			} else {
				secrets = append(secrets, u.User.Username()) // a token
			}
		}
	}
	secrets = append(secrets, auth.Password, auth.Token)
	return func(s string) string {
		for _, sec := range secrets {
			if sec != "" {
				s = strings.ReplaceAll(s, sec, "REDACTED")
			}
		}
		return s
	}
}

// redactedError is err with its text redacted.
type redactedError struct {
	err    error
	redact func(string) string
}

func (e redactedError) Error() string { return e.redact(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }
