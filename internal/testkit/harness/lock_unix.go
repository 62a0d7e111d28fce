//go:build unix

package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// heavyLock takes an exclusive flock on a file in the temp directory; the
// kernel drops it when the holder exits, so a killed test binary never
// leaves it taken.
func heavyLock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("kvindex-heavy-tests-%d.lock", os.Getuid())), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
