package storeopen

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The secret every test URL carries as its password: no error and no
// Display may show it.
const secret = "s3cretpw"

func TestParseRedis(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     RedisConfig
		display string
		addrs   []string
		check   func(t *testing.T, rt *RedisTarget)
	}{
		{name: "host:port", cfg: RedisConfig{Addr: "127.0.0.1:6379"}, display: "127.0.0.1:6379", addrs: []string{"127.0.0.1:6379"},
			check: func(t *testing.T, rt *RedisTarget) {
				if o := rt.Options(); o.Addr != "127.0.0.1:6379" || o.TLSConfig != nil || o.Password != "" {
					t.Errorf("options %+v", o)
				}
			}},
		{name: "URL", cfg: RedisConfig{Addr: "redis://dedup:" + secret + "@127.0.0.1:6380/2"}, display: "redis://dedup:xxxxx@127.0.0.1:6380/2", addrs: []string{"127.0.0.1:6380"},
			check: func(t *testing.T, rt *RedisTarget) {
				o := rt.Options()
				if o.Addr != "127.0.0.1:6380" || o.DB != 2 || o.Username != "dedup" || o.Password != secret || o.TLSConfig != nil || rt.TLS {
					t.Errorf("options %+v", o)
				}
			}},
		{name: "URL without port", cfg: RedisConfig{Addr: "redis://:" + secret + "@localhost"}, display: "redis://:xxxxx@localhost", addrs: []string{"localhost:6379"}},
		{name: "TLS", cfg: RedisConfig{Addr: "rediss://dedup:" + secret + "@localhost:6380/0"}, display: "rediss://dedup:xxxxx@localhost:6380/0", addrs: []string{"localhost:6380"},
			check: func(t *testing.T, rt *RedisTarget) {
				o := rt.Options()
				if !rt.TLS || o.TLSConfig == nil || o.TLSConfig.ServerName != "localhost" || o.TLSConfig.RootCAs != nil {
					t.Errorf("TLS %v, config %+v", rt.TLS, o.TLSConfig)
				}
			}},
		// Passwords holding what a URL uses, the special ones percent-encoded.
		{name: "password with @ and :", cfg: RedisConfig{Addr: "redis://dedup:p@ss:w0rd@h:1/3"}, display: "redis://dedup:xxxxx@h:1/3", addrs: []string{"h:1"},
			check: func(t *testing.T, rt *RedisTarget) {
				if o := rt.Options(); o.Password != "p@ss:w0rd" || o.DB != 3 {
					t.Errorf("options %+v", o)
				}
			}},
		{name: "password percent-encoded", cfg: RedisConfig{Addr: "redis://dedup:a%2Cb%2Fc%3Fd%23e%25f@h:1"}, display: "redis://dedup:xxxxx@h:1", addrs: []string{"h:1"},
			check: func(t *testing.T, rt *RedisTarget) {
				if o := rt.Options(); o.Password != "a,b/c?d#e%f" {
					t.Errorf("password %q", o.Password)
				}
			}},
		{name: "IPv6", cfg: RedisConfig{Addr: "redis://dedup:" + secret + "@[::1]:6379/1"}, display: "redis://dedup:xxxxx@[::1]:6379/1", addrs: []string{"[::1]:6379"}},
		{name: "IPv6 host:port", cfg: RedisConfig{Addr: "[::1]:6379"}, display: "[::1]:6379", addrs: []string{"[::1]:6379"}},
		{name: "cluster addresses", cfg: RedisConfig{Addr: "10.0.0.1:7000, 10.0.0.2:7000", Cluster: true}, display: "10.0.0.1:7000,10.0.0.2:7000", addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000"}},
		{name: "cluster URL", cfg: RedisConfig{Addr: "redis://dedup:" + secret + "@10.0.0.1:7000?addr=10.0.0.2:7000", Cluster: true},
			display: "redis://dedup:xxxxx@10.0.0.1:7000?addr=10.0.0.2:7000", addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000"},
			check: func(t *testing.T, rt *RedisTarget) {
				if o := rt.cluster; o.Username != "dedup" || o.Password != secret {
					t.Errorf("options %+v", o)
				}
			}},
		{name: "cluster URLs", cfg: RedisConfig{Addr: "rediss://dedup:" + secret + "@n1:7000,rediss://dedup:" + secret + "@n2:7000", Cluster: true},
			display: "rediss://dedup:xxxxx@n1:7000,rediss://dedup:xxxxx@n2:7000", addrs: []string{"n1:7000", "n2:7000"},
			check: func(t *testing.T, rt *RedisTarget) {
				// Each node is verified by its own name.
				if c := rt.cluster.TLSConfig; !rt.TLS || c == nil || c.ServerName != "" {
					t.Errorf("TLS config %+v", c)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := ParseRedis(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rt.Display != tc.display || !slices.Equal(rt.addrs, tc.addrs) || rt.Cluster != tc.cfg.Cluster {
				t.Errorf("got display %q, addresses %q, cluster %v; want %q, %q", rt.Display, rt.addrs, rt.Cluster, tc.display, tc.addrs)
			}
			if tc.check != nil {
				tc.check(t, rt)
			}
		})
	}
}

// A setting that does not parse names its flag, and shows no password,
// nor any part of one.
func TestParseRedisErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg     RedisConfig
		setting string
		says    string
	}{
		{RedisConfig{Addr: ""}, RedisSetting, "no Redis address"},
		{RedisConfig{Addr: "localhost"}, RedisSetting, "neither host:port nor"},
		{RedisConfig{Addr: "dedup:" + secret + "@localhost:6379"}, RedisSetting, "must be a URL"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h:1/x"}, RedisSetting, "redis://dedup:xxxxx@h:1/x: redis: invalid database number"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h:1?nonsense=1"}, RedisSetting, "unexpected option: nonsense"},
		// A '#' in the password ends the host early: url.Parse's error
		// would quote the rest of the password as a port.
		{RedisConfig{Addr: "redis://dedup:s3c#" + secret + "@h:1"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "redis://dedup:s3c/" + secret + "@h:1"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "redis://dedup:123#" + secret + "@h"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "redis://dedup:123/" + secret + "@h"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "h:1,redis://dedup:123?" + secret + "@h", Cluster: true}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "http://dedup:" + secret + "@h:1"}, RedisSetting, "invalid URL scheme: http"},
		{RedisConfig{Addr: "unix://dedup:" + secret + "@/tmp/redis.sock"}, RedisSetting, "only redis:// and rediss://"},
		{RedisConfig{Addr: "h1:1,h2:2"}, RedisSetting, "add -redis-cluster"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h1:1,h2:2", Cluster: true}, RedisSetting, "mixes URLs and host:port"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h1:1,redis://other:" + secret + "@h2:2", Cluster: true}, RedisSetting, "differ in scheme or credentials"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h1:1,rediss://dedup:" + secret + "@h2:2", Cluster: true}, RedisSetting, "differ in scheme or credentials"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h1:1/3", Cluster: true}, RedisSetting, "database 0 only"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h:1", TLS: RedisTLS{CAFile: notPEM}}, RedisCASetting, "TLS needs a rediss:// URL"},
		{RedisConfig{Addr: "h:1", TLS: RedisTLS{CertFile: notPEM}}, RedisCertSetting, "TLS needs a rediss:// URL"},
		{RedisConfig{Addr: "rediss://dedup:" + secret + "@h:1", TLS: RedisTLS{CAFile: notPEM}}, RedisCASetting, "no PEM certificate"},
		{RedisConfig{Addr: "rediss://dedup:" + secret + "@h:1", TLS: RedisTLS{CAFile: filepath.Join(dir, "missing.pem")}}, RedisCASetting, "no such file"},
		{RedisConfig{Addr: "rediss://dedup:" + secret + "@h:1", TLS: RedisTLS{CertFile: notPEM}}, RedisKeySetting, "needs its key"},
		{RedisConfig{Addr: "rediss://dedup:" + secret + "@h:1", TLS: RedisTLS{CertFile: notPEM, KeyFile: notPEM}}, RedisCertSetting, "-redis-cert"},
		// A ',' in the password splits the URL in two: the halves may
		// parse (host "dedup", port 1234), and must show nothing.
		{RedisConfig{Addr: "redis://dedup:1234," + secret + "@h:1/0"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "redis://dedup:1234," + secret + "@h:1/0", Cluster: true}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "redis://dedup:s3c," + secret + "@h:1/0"}, RedisSetting, "not a valid URL"},
		{RedisConfig{Addr: "rediss://dedup:" + secret + "@h:1,dedup:" + secret + "@h:2", Cluster: true}, RedisSetting, "not a valid URL"},
		// go-redis takes a negative database for 0 (it SELECTs only a
		// positive one).
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h:1/-1"}, RedisSetting, "database -1"},
		{RedisConfig{Addr: "redis://dedup:" + secret + "@h:1?db=-2"}, RedisSetting, "database -2"},
	} {
		_, err := ParseRedis(tc.cfg)
		var s *SettingError
		if !errors.As(err, &s) || !strings.Contains(s.Setting, tc.setting) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: got %v, want a *SettingError of %s saying %q", tc.cfg, err, tc.setting, tc.says)
		}
		if err != nil && strings.Contains(err.Error(), secret[3:]) {
			t.Errorf("%+v: the error shows the password: %v", tc.cfg, err)
		}
	}
}

func TestRedactRedis(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:6379":                          "127.0.0.1:6379",
		"redis://u:" + secret + "@h:1/0":          "redis://u:xxxxx@h:1/0",
		"rediss://:" + secret + "@h:1,h:2":        "rediss://:xxxxx@h:1,h:2",
		"redis://u:s3c#" + secret + "@h:1":        "(unparsable Redis URL)",
		"redis://u:123#" + secret + "@h":          "(unparsable Redis URL)", // url.Parse: host u, port 123, a fragment
		"redis://u:123/" + secret + "@h":          "(unparsable Redis URL)", // url.Parse: a path
		"redis://u:123?" + secret + "@h":          "(unparsable Redis URL)", // url.Parse: a query
		"redis://u:%zz" + secret + "@h:1":         "(unparsable Redis URL)",
		"redis://u@h:1":                           "redis://u@h:1",
		"rediss://h:1?addr=h:2&dial_timeout=3s":   "rediss://h:1?addr=h:2&dial_timeout=3s",
		" redis://u:" + secret + "@h:1 , h:2 , ":  "redis://u:xxxxx@h:1,h:2",
		"redis://u:" + secret + "@[::1]:6379/1":   "redis://u:xxxxx@[::1]:6379/1",
		"redis://u:" + secret + "@h:1/0#fragment": "redis://u:xxxxx@h:1/0#fragment",
		"redis://u:1234," + secret + "@h:1/0":     "(unparsable Redis URL)", // a ',' in the password
		"redis://u:1234,x,y," + secret + "@h:1/0": "(unparsable Redis URL)",
	} {
		if got := RedactRedis(in); got != want {
			t.Errorf("RedactRedis(%q) = %q, want %q", in, got, want)
		}
	}
}
