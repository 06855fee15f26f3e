package main

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
)

// listIDs is the id of every record list -json shows with args, by
// token ("" for the done records, which have none, mapped to the last).
func (tg *target) listed(t *testing.T, args ...string) []recordJSON {
	t.Helper()
	var page struct {
		Records []recordJSON `json:"records"`
	}
	tg.run(t, append([]string{"list", "-json", "-limit=10000"}, args...)...).want(t, exitOK).json(t, &page)
	return page.Records
}

// The stuck claims list shows on a SQL store are released by their id,
// and done records forgotten by it, with the dry run, -yes and the state
// checks of SCOPE KEY (#23): on the digest layouts list can give nothing
// else back.
func TestForgetAndReleaseByID(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope, c := tg.seed(t)

		var pid, did string
		for _, r := range tg.listed(t, "-state=processing") {
			if r.Token == c.Token {
				pid = r.ID
			}
		}
		rec, err := tg.admin.Get(t.Context(), scope, "d1")
		if err != nil {
			t.Fatal(err)
		}
		did = rec.ID
		if pid == "" {
			t.Fatalf("list -state=processing does not show the claim of token %s", c.Token)
		}

		// get -id reads what list showed.
		tg.run(t, "get", "-id="+pid).want(t, exitOK).field(t, "token", c.Token)
		var got recordJSON
		tg.run(t, "get", "-id="+did, "-json").want(t, exitOK).json(t, &got)
		if got.ID != did || got.State != "done" {
			t.Fatalf("get -id -json = %+v", got)
		}

		// Without -yes nothing changes; the wrong state is refused.
		tg.run(t, "release", "-id="+pid).want(t, exitRefused, "stdout:would release 1 record", "stdout:"+pid, "stderr:nothing deleted: add -yes")
		tg.run(t, "forget", "-id="+pid, "-yes").want(t, exitRefused, "stderr:is processing", "stderr:release frees a claim")
		tg.run(t, "release", "-id="+did, "-yes").want(t, exitRefused, "stderr:is done", "stderr:forget deletes a done record")
		if tg.result(t, scope, "d1") != stores.Duplicate || tg.result(t, scope, "p1") != stores.InProgress {
			t.Fatal("a refused forget or release by id changed a record")
		}

		// release -id frees the claim; its owner is fenced off.
		var res removeResult
		tg.run(t, "release", "-id="+pid, "-yes", "-json").want(t, exitOK).json(t, &res)
		if len(res.Deleted) != 1 || res.Deleted[0].ID != pid || res.Deleted[0].Token != c.Token {
			t.Fatalf("release -id -json = %+v", res)
		}
		if err := tg.store.Complete(t.Context(), c, time.Hour, nil); !errors.Is(err, stores.ErrLostClaim) {
			t.Fatalf("Complete by the owner of a claim released by id: %v", err)
		}
		tg.run(t, "forget", "-id="+did, "-yes").want(t, exitOK, "stdout:forgot", "stdout:"+did)
		if got := tg.result(t, scope, "d1"); got != stores.Claimed {
			t.Fatalf("after forget -id, a claim is %s", got)
		}
		tg.run(t, "forget", "-id="+did, "-yes").want(t, exitNotFound, "stderr:no record with id "+did, "stderr:nothing to forget")
		tg.run(t, "get", "-id="+did).want(t, exitNotFound)

		// Bad usage.
		tg.run(t, "release", "-id="+pid, scope, "p1").want(t, exitUsage, "stderr:release takes SCOPE KEY or -id, not both")
		tg.run(t, "forget", "-id="+pid, "-prefix=p").want(t, exitUsage, "stderr:-id")
		tg.run(t, "get", "-id=not-an-id").want(t, exitUsage, "stderr:not-an-id")
	})
}

// get -id prints the scope and key of the record it finds where the store
// keeps them, and says plainly that it cannot know them where it keeps a
// digest of them: it printed scope "?" and key "?". An id that names no
// record says what -id takes: not a message's id.
func TestGetByIDScopeAndKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env, kind anystore.StoreKind) {
		tg := e.open(t, kind, "")
		scope, _ := tg.seed(t)
		rec, err := tg.admin.Get(t.Context(), scope, "d1")
		if err != nil {
			t.Fatal(err)
		}
		r := tg.run(t, "get", "-id="+rec.ID).want(t, exitOK)
		if strings.Contains(r.stdout, `"?"`) {
			t.Errorf("get -id prints a scope or key of \"?\"\n%s", r)
		}
		if tg.scopes {
			r.field(t, "scope", strconv.Quote(scope))
			r.field(t, "key", `"d1"`)
			return
		}
		r.want(t, exitOK, "stdout:not stored", "stdout:digest of (scope, key)", "stdout:get SCOPE KEY")
		if kind == anystore.StoreSQLite { // a message's id is a UUID, as a SQL record's
			tg.run(t, "get", "-id="+watermill.NewUUID()).want(t, exitNotFound, "stderr:not a message's id")
		}
	})
}
