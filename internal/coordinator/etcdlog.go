package coordinator

import (
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// maxEtcdLogBytes bounds the embedded etcd's log file; with its one
// rotated predecessor the log takes at most twice this on disk.
const maxEtcdLogBytes = 8 << 20

// etcdLog is the embedded etcd's log file, bounded: a write that would
// take the file past max first renames it to path+".1" (replacing the
// previous one) and starts a new file. It is safe for concurrent use.
type etcdLog struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

// openEtcdLog opens (appending to) or creates path.
func openEtcdLog(path string, max int64) (*etcdLog, error) {
	w := &etcdLog{path: path, max: max}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *etcdLog) open() error {
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("coordinator: embedded etcd log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("coordinator: embedded etcd log: %w", err)
	}
	w.f, w.size = f, st.Size()
	return nil
}

// Write appends p, rotating first when p would not fit.
func (w *etcdLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return 0, os.ErrClosed
	}
	if w.size > 0 && w.size+int64(len(p)) > w.max {
		_ = w.f.Close()
		w.f = nil
		if err := os.Rename(w.path, w.path+".1"); err != nil {
			return 0, fmt.Errorf("coordinator: rotate embedded etcd log: %w", err)
		}
		if err := w.open(); err != nil {
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	w.size += int64(n)
	return n, err
}

// Sync flushes the file.
func (w *etcdLog) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	return w.f.Sync()
}

// Close closes the file; later writes fail with os.ErrClosed.
func (w *etcdLog) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// etcdLogger is the embedded etcd's logger: JSON lines of errors and worse
// to w, as etcd writes to stderr by default.
func etcdLogger(w *etcdLog) *zap.Logger {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), w, zapcore.ErrorLevel)
	return zap.New(core)
}
