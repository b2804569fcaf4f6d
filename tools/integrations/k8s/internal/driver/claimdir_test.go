package driver

// The claim directories at a driver restart: whatever a pod (or anyone)
// left at the claim socket's name, or at the claim directory's, is not
// followed.  No qrtd is needed: a restart serves the claim sockets of the
// checkpoints before it asks qrtd anything.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// restartDriver starts a driver (New, then the claim sockets of its
// checkpoints, as Run does) and stops it again (its sockets closed, as
// at a kill).
func restartDriver(t *testing.T, cfg Config) {
	t.Helper()
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	d.ServeClaims(context.Background())
	if len(d.proxies) != len(d.preparedClaims()) {
		t.Fatalf("restart served %d claim sockets of %d prepared claims", len(d.proxies), len(d.preparedClaims()))
	}
	d.stopAllClaims()
}

func writePrepared(t *testing.T, cfg Config, uid types.UID) {
	t.Helper()
	data, err := json.Marshal(&Checkpoint{UID: uid, Namespace: "team-a", Name: string(uid),
		Slots: []Slot{{ReservationID: 1, QPU: "qpu0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "claims", string(uid)+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func modeOf(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode()
}

func TestARestartedDriverFollowsNoSymlinkInTheClaimDirectory(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeName: nodeName, StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi")}
	// Files of someone else's: what a symlink would point at.
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	victimDir := filepath.Join(dir, "victim-dir")
	if err := os.Mkdir(victimDir, 0o700); err != nil {
		t.Fatal(err)
	}
	restartDriver(t, cfg) // makes claims/
	claims := filepath.Join(cfg.StateDir, "claims")

	// A claim directory that is a symlink to another directory: the
	// driver neither changes that directory's mode nor serves the socket
	// in it; it makes the claim's own directory.
	writePrepared(t, cfg, "uid-dir")
	if err := os.Symlink(victimDir, filepath.Join(claims, "uid-dir")); err != nil {
		t.Fatal(err)
	}
	restartDriver(t, cfg)
	if m := modeOf(t, victimDir); m.Perm() != 0o700 {
		t.Errorf("the directory a claim directory's symlink points at became %v", m)
	}
	if _, err := os.Lstat(filepath.Join(victimDir, "qrtd.sock")); err == nil {
		t.Errorf("the claim socket was served in the directory a symlink points at")
	}
	if m := modeOf(t, filepath.Join(claims, "uid-dir")); !m.IsDir() || m.Perm() != claimDirMode {
		t.Errorf("the claim directory is %v, not a directory of mode %o", m, claimDirMode)
	}
	if m := modeOf(t, filepath.Join(claims, "uid-dir", "qrtd.sock")); m&os.ModeSocket == 0 || m.Perm() != claimSockMode {
		t.Errorf("the claim socket is %v, not a socket of mode %o", m, claimSockMode)
	}

	// A symlink planted at the socket's name, before the restart, and
	// renamed over the new socket the moment it appears (what a root pod
	// with a writable mount could do, racing the restart): the file it
	// points at keeps its mode.  A racer thread waits on inotify for the
	// socket's creation and renames at once; rounds bounds the tries.  (The
	// code this replaced, bind then chmod by path, lost in a few rounds.)
	writePrepared(t, cfg, "uid-race")
	restartDriver(t, cfg)
	cdir := filepath.Join(claims, "uid-race")
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, cdir, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	const rounds = 40
	evil := filepath.Join(cdir, ".evil")
	var stop atomic.Bool
	swapped := make(chan int, 1)
	handled := make(chan struct{}, rounds+1) // one for each socket made
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		n := 0
		buf := make([]byte, 4096)
		for !stop.Load() {
			fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}}
			if k, err := unix.Poll(fds, 50); err != nil || k == 0 {
				continue
			}
			k, err := unix.Read(in, buf)
			for off := 0; err == nil && off+unix.SizeofInotifyEvent <= k; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				at := off + unix.SizeofInotifyEvent
				name := strings.TrimRight(string(buf[at:at+int(ev.Len)]), "\x00")
				off = at + int(ev.Len)
				if name == "qrtd.sock" {
					if unix.Rename(evil, filepath.Join(cdir, "qrtd.sock")) == nil {
						n++
					}
					handled <- struct{}{}
				}
			}
		}
		swapped <- n
	}()
	for i := 0; i < rounds; i++ {
		_ = os.Remove(evil)
		if err := os.Symlink(victim, evil); err != nil {
			t.Fatal(err)
		}
		restartDriver(t, cfg)
		select {
		case <-handled:
		case <-time.After(10 * time.Second):
			stop.Store(true)
			t.Fatalf("round %d: the racer did not see the new socket", i)
		}
		if m := modeOf(t, victim); m.Perm() != 0o600 {
			stop.Store(true)
			t.Fatalf("round %d: a symlink renamed over the claim socket at a restart made its target %v", i, m)
		}
	}
	stop.Store(true)
	n := <-swapped
	t.Logf("%d restarts, the symlink renamed over the new socket in %d; the target kept mode 0600", rounds, n)
	if n != rounds {
		t.Errorf("the racer replaced the socket in %d restarts of %d", n, rounds)
	}
	restartDriver(t, cfg)
	if m := modeOf(t, filepath.Join(cdir, "qrtd.sock")); m&os.ModeSocket == 0 || m.Perm() != claimSockMode {
		t.Errorf("after the races the claim socket is %v, not a socket of mode %o", m, claimSockMode)
	}
}
