//go:build linux

package proxyapp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The handover socket is SOCK_SEQPACKET: one message per write, and the
// descriptors stay attached to theirs.

// dialHandover connects to the handover socket at path; nil, nil when no
// process listens there. The listening process must be of this user or
// root (SO_PEERCRED): another user's would hand this one its sockets.
func dialHandover(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("handover socket: %w", err)
	}
	if err := checkPeer(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// checkHandoverDir refuses a handover socket path whose directory another
// user could write: there, anyone could put a socket of their own at
// path before this process, or between two of its starts.
func checkHandoverDir(path string) error {
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("%w: %v", errHandoverDir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("%w: %s: %v", errHandoverDir, dir, err)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid && st.Uid != 0 {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d) or root; use a directory only this user can write (e.g. systemd's RuntimeDirectory=)",
			errHandoverDir, dir, st.Uid, uid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %#o); use a directory only this user can write (chmod go-w, or systemd's RuntimeDirectory=)",
			errHandoverDir, dir, st.Mode&0o7777)
	}
	return nil
}

// A handoverListener is where a running cidproxy waits for its successor.
type handoverListener struct {
	ln   *net.UnixListener
	path string
	ino  uint64 // of the socket file this listener created
	log  *slog.Logger
}

// listenHandover binds path (mode 0600), replacing whatever file is there
// by a rename, so that a successor's socket replaces its predecessor's
// atomically.
func listenHandover(path string, log *slog.Logger) (*handoverListener, error) {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d", filepath.Base(path), os.Getpid()))
	os.Remove(tmp)
	old := unix.Umask(0o077) // the socket file is born 0600
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("handover socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // the name may be a successor's by then
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("handover socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("handover socket: %w", err)
	}
	return &handoverListener{ln: ln, path: path, ino: st.Ino, log: log}, nil
}

// accept waits for a successor of this process's user or root.
func (l *handoverListener) accept() (*net.UnixConn, error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if err := checkPeer(c); err != nil {
			l.log.Warn("handover socket: connection refused", "err", err)
			c.Close()
			continue
		}
		return c, nil
	}
}

// checkPeer refuses a peer of another user than this one or root. Each
// side checks the other: the successor, that the sockets come from a
// process it may trust; the predecessor, that they go to one (the
// socket file's mode already says so, unless it was changed).
func checkPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if uid := uint32(os.Geteuid()); cred.Uid != uid && cred.Uid != 0 {
		return fmt.Errorf("%w: pid %d of uid %d (this process: uid %d)", errHandoverPeer, cred.Pid, cred.Uid, uid)
	}
	return nil
}

// dupFile duplicates c's descriptor (close-on-exec), without the
// blocking mode that File would set on the shared socket.
func dupFile(c syscall.Conn) (*os.File, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("dup: %w", derr)
	}
	return os.NewFile(uintptr(fd), "kept"), nil
}

// close stops listening, and removes the socket file if it is still this
// listener's (no successor has put its own there). After a handover it
// leaves the file: the successor renames its own over it at any moment,
// and would lose it between the check and the removal.
func (l *handoverListener) close(handedOver bool) {
	l.ln.Close()
	if handedOver {
		return
	}
	var st unix.Stat_t
	if unix.Stat(l.path, &st) == nil && st.Ino == l.ino {
		os.Remove(l.path)
	}
}

// sendHandover sends m with the descriptors of conns attached; the
// kernel duplicates them into the receiver.
func sendHandover(c *net.UnixConn, m hoMsg, conns []syscall.Conn, deadline time.Time) error {
	b, err := marshalHandover(m)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(deadline)
	err = withFDs(conns, nil, func(fds []int) error {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		_, _, err := c.WriteMsgUnix(b, oob, nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("handover: sending %s: %w", m.Type, err)
	}
	return nil
}

// withFDs calls f with the descriptors of conns, each held by its
// RawConn's Control (so that none is closed meanwhile) without the
// blocking mode that File().Fd() would set on the shared socket.
func withFDs(conns []syscall.Conn, fds []int, f func([]int) error) error {
	if len(conns) == 0 {
		return f(fds)
	}
	rc, err := conns[0].SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = withFDs(conns[1:], append(fds, int(fd)), f) }); err != nil {
		return err
	}
	return ferr
}

func recvHandover(c *net.UnixConn, deadline time.Time) (hoMsg, []*os.File, error) {
	b := make([]byte, handoverMaxMsg)
	oob := make([]byte, unix.CmsgSpace(handoverFDsPerMsg*4))
	c.SetReadDeadline(deadline)
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if errors.Is(err, io.EOF) {
		return hoMsg{}, nil, errHandoverClosed
	}
	if err != nil {
		return hoMsg{}, nil, fmt.Errorf("handover: receiving: %w", err)
	}
	var files []*os.File
	if oobn > 0 {
		scms, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return hoMsg{}, nil, fmt.Errorf("handover: control message: %w", err)
		}
		for _, scm := range scms {
			fds, err := unix.ParseUnixRights(&scm)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "handover"))
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFiles(files)
		return hoMsg{}, nil, errors.New("handover: message truncated")
	}
	if n == 0 {
		closeFiles(files)
		return hoMsg{}, nil, errHandoverClosed
	}
	m, err := unmarshalHandover(b[:n])
	if err != nil {
		closeFiles(files)
		return hoMsg{}, nil, err
	}
	return m, files, nil
}
