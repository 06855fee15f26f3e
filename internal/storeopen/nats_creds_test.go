package storeopen_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/watermill-dedup/dedup/internal/storeopen"
	"github.com/watermill-dedup/dedup/internal/testkit"
)

// A credentials file (-nats-creds) on a server in operator (JWT) mode.
// The JWTs are made here, with the nkeys module alone (the jwt module
// is not a dependency): a JWT is a header, claims and an ed25519
// signature by the issuer's nkey, each base64url-encoded.

// natsJWT returns the JWT of claims about subject, issued and signed by
// issuer, of kind ("operator", "account", "user") with the fields nats.
func natsJWT(t *testing.T, issuer nkeys.KeyPair, subject, name string, nats map[string]any) string {
	t.Helper()
	iss, err := issuer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	nats["version"] = 2
	head := enc(map[string]string{"typ": "JWT", "alg": "ed25519-nkey"})
	body := enc(map[string]any{"jti": name + strconv.FormatInt(time.Now().UnixNano(), 36), "iat": time.Now().Unix(), "iss": iss, "sub": subject, "name": name, "nats": nats})
	sig, err := issuer.Sign([]byte(head + "." + body))
	if err != nil {
		t.Fatal(err)
	}
	return head + "." + body + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestNATSCredsFile(t *testing.T) {
	operator, _ := nkeys.CreateOperator()
	account, _ := nkeys.CreateAccount()
	system, _ := nkeys.CreateAccount() // JetStream needs a system account
	sysPub, _ := system.PublicKey()
	user, _ := nkeys.CreateUser()
	opPub, _ := operator.PublicKey()
	accPub, _ := account.PublicKey()
	userPub, _ := user.PublicKey()
	unlimited := map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true,
		"conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
	opJWT := natsJWT(t, operator, opPub, "test-operator", map[string]any{"type": "operator"})
	accJWT := natsJWT(t, operator, accPub, "dedup", map[string]any{"type": "account", "limits": unlimited})
	sysJWT := natsJWT(t, operator, sysPub, "SYS", map[string]any{"type": "account", "limits": map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1}})
	userJWT := natsJWT(t, account, userPub, "dedup-user", map[string]any{"type": "user", "pub": map[string]any{}, "sub": map[string]any{}, "subs": -1, "data": -1, "payload": -1})
	seed, _ := user.Seed()

	dir := t.TempDir()
	opFile := filepath.Join(dir, "operator.jwt")
	if err := os.WriteFile(opFile, []byte(opJWT), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "user.creds")
	text := "-----BEGIN NATS USER JWT-----\n" + userJWT + "\n------END NATS USER JWT------\n\n" +
		"-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	if err := os.WriteFile(creds, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := "operator: \"" + opFile + "\"\nsystem_account: " + sysPub + "\nresolver: MEMORY\nresolver_preload: {\n  " +
		accPub + ": \"" + accJWT + "\"\n  " + sysPub + ": \"" + sysJWT + "\"\n}\n"
	addr := testkit.StartNATSSecure(t, conf, nats.UserCredentials(creds))

	nc, err := storeopen.Opener{}.NATS(context.Background(), "nats://"+addr, storeopen.NATSAuth{CredsFile: creds})
	usable(t, "-nats-creds", nc, err, false)
	// Without them the server refuses.
	if _, err := (storeopen.Opener{}).NATS(context.Background(), "nats://"+addr, storeopen.NATSAuth{}); err == nil || !strings.Contains(err.Error(), "refused the connection") {
		t.Fatalf("without credentials: %v, want a refusal", err)
	}
}
