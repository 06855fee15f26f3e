package natstest_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/natstest"
)

// TestStartNATSCluster: three servers that form one JetStream cluster
// (a replicated stream has a leader among them), a server killed and
// started again with its name and ports, one paused and resumed; and
// every process gone when the test that started them ends, the paused
// one too.
func TestStartNATSCluster(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		cl := natstest.StartNATSCluster(t, 3, "")
		js := natstest.JetStream(t, cl.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, 30*time.Second, "the stream to have a leader", func() bool {
			info, err := st.Info(ctx)
			return err == nil && info.Cluster != nil && cl.Index(info.Cluster.Leader) >= 0
		})

		s := cl.Servers[1]
		pid := s.PID()
		s.Kill()
		if s.Running() || s.PID() != 0 || alive(pid) {
			t.Fatalf("server %s (pid %d) still running after Kill", s.Name, pid)
		}
		s.Start()
		if !s.Running() || s.PID() == pid {
			t.Fatalf("server %s not started again: running %t, pid %d", s.Name, s.Running(), s.PID())
		}

		p := cl.Servers[2]
		p.Pause()
		pc, err := nats.Connect(p.URL(), nats.Timeout(300*time.Millisecond), nats.NoReconnect())
		if err == nil {
			pc.Close()
			t.Fatalf("a paused server accepted a connection")
		}
		p.Resume()
		pc, err = nats.Connect(p.URL(), nats.Timeout(10*time.Second))
		if err != nil {
			t.Fatalf("connect to the resumed server: %v", err)
		}
		pc.Close()
		p.Pause() // the test ends with it paused
		for _, s := range cl.Servers {
			pids = append(pids, s.PID())
		}
	})
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("nats-server pid %d still running after its test ended", pid)
		}
	}
}

// alive reports whether process pid exists (and is not a zombie reaped
// already: Kill waits for it).
func alive(pid int) bool {
	return pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// TestCurrentNATS: the current release starts, and says it is that
// release with per-message TTLs (JetStream API level 1 or more). Its
// clusters run in natsstore's TestClusterFailover.
func TestCurrentNATS(t *testing.T) {
	bin := natstest.CurrentNATS(t)
	s := bin.Start(t, "")
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got, want := "v"+nc.ConnectedServerVersion(), natstest.CurrentNATSVersion; got != want {
		t.Errorf("server version %s, want %s", got, want)
	}
	if js, level := nc.ConnectedServerJetStream(); !js || level < 1 {
		t.Errorf("JetStream %t, API level %d: want JetStream with level 1 or more", js, level)
	}
}
