package driver

// The claim directories and their sockets, made without following a
// symlink and without changing a mode by path.  A claim's directory is
// bind-mounted into its pod (read-only, but a pod that got it writable once
// is not trusted either): whatever is found at the socket's name, or at the
// directory's, is unlinked, never followed, and the socket is created with
// its final mode (0666) by bind itself, so there is no moment at which a
// chmod could land on something planted in its place.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Modes of the claims' directories and sockets: claims/ is the driver's
// alone (no host user reaches a socket by its path); a claim's directory
// is searchable and its socket writable by every uid, since the pod's uid
// may be any and it reaches them through its bind mount alone.
const (
	claimsDirMode = 0o750
	claimDirMode  = 0o711
	claimSockMode = 0o666
)

// openDirNoFollow opens a directory for the *at calls, refusing a symlink.
func openDirNoFollow(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// ownDir checks that the directory open as fd is the driver's and gives it
// mode on the descriptor.
func ownDir(fd int, path string, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if euid := os.Geteuid(); st.Uid != uint32(euid) {
		return fmt.Errorf("%s is owned by uid %d, not by the driver's uid %d", path, st.Uid, euid)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

// prepareClaimsDir makes the state directory's claims/ the driver's alone.
func prepareClaimsDir(path string) error {
	if err := os.MkdirAll(path, claimsDirMode); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	fd, err := openDirNoFollow(unix.AT_FDCWD, path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	return ownDir(fd, path, claimsDirMode)
}

// openClaimDir opens claims/<uid>, creating it, as a directory of the
// driver's with mode 0711.  Anything else found at that name (a symlink, a
// file) is unlinked, not followed, and the directory made again.
func openClaimDir(claims string, uid string) (int, error) {
	cfd, err := openDirNoFollow(unix.AT_FDCWD, claims)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", claims, err)
	}
	defer unix.Close(cfd)
	path := claims + "/" + uid
	for attempt := 0; ; attempt++ {
		if err := unix.Mkdirat(cfd, uid, claimDirMode); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create %s: %w", path, err)
		}
		fd, err := openDirNoFollow(cfd, uid)
		if err == nil {
			if err := ownDir(fd, path, claimDirMode); err != nil {
				unix.Close(fd)
				return -1, err
			}
			return fd, nil
		}
		if attempt > 0 || !(errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)) {
			return -1, fmt.Errorf("open %s: %w", path, err)
		}
		// Not a directory (a symlink among them): claims/ is the
		// driver's alone, so the name is freed and made again.
		if err := unix.Unlinkat(cfd, uid, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("remove %s, which is not a directory: %w", path, err)
		}
	}
}

// listenInClaimDir serves a UNIX socket called name in the directory open
// as dirfd.  What was at that name is unlinked (a symlink is removed, its
// target untouched).  The socket gets mode 0666 from bind itself: the
// socket's own inode is given the mode before bind (fchmod on the
// descriptor), and bind runs on a thread whose umask is 0.  bind names the
// directory by its descriptor (/proc/self/fd/N/name), so it lands in the
// directory that was checked, whatever happens to the path meanwhile.  The
// listener does not unlink the socket when it is closed: a restarted driver
// replaces it, and unprepare removes the directory.
func listenInClaimDir(dirfd int, path, name string) (net.Listener, error) {
	if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("remove the old claim socket %s: %w", path, err)
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("claim socket %s: %w", path, err)
	}
	f := os.NewFile(uintptr(s), path) // closes s
	defer f.Close()
	if err := unix.Fchmod(s, claimSockMode); err != nil {
		return nil, fmt.Errorf("claim socket %s: fchmod: %w", path, err)
	}
	addr := &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name}
	if err := onZeroUmaskThread(func() error { return unix.Bind(s, addr) }); err != nil {
		return nil, fmt.Errorf("bind the claim socket %s: %w", path, err)
	}
	if err := unix.Listen(s, unix.SOMAXCONN); err != nil {
		return nil, fmt.Errorf("listen on the claim socket %s: %w", path, err)
	}
	ln, err := net.FileListener(f) // a duplicate descriptor
	if err != nil {
		return nil, fmt.Errorf("claim socket %s: %w", path, err)
	}
	return ln, nil
}

// The thread whose umask is 0.  The umask is a process's, shared by its
// threads, and changing it around a bind would give every file another
// goroutine creates meanwhile a wider mode.  This thread unshares its file
// system attributes (CLONE_FS: umask, root, working directory) first, so its
// umask is its own.  It stays locked to its goroutine, which never ends:
// Go never runs anything else on it, and starts new threads from a clean
// template thread, not from it.
var zeroUmask struct {
	once  sync.Once
	calls chan func()
	err   error
}

func onZeroUmaskThread(fn func() error) error {
	zeroUmask.once.Do(func() {
		zeroUmask.calls = make(chan func())
		ready := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				ready <- fmt.Errorf("unshare CLONE_FS: %w", err)
				return
			}
			unix.Umask(0)
			ready <- nil
			for call := range zeroUmask.calls {
				call()
			}
		}()
		zeroUmask.err = <-ready
	})
	if zeroUmask.err != nil {
		return zeroUmask.err
	}
	done := make(chan error, 1)
	zeroUmask.calls <- func() { done <- fn() }
	return <-done
}
