package config

import (
	"os"
	"time"
)

// fileStamp is what the poll compares to tell that the config file changed
// without reading it: size and modification time, plus where the system
// has them the change time and the inode, which a copy that keeps the
// modification time (cp -p, rsync -t, tar) cannot keep.
type fileStamp struct {
	mod   time.Time
	size  int64
	ctime int64 // ns; 0 where unknown
	ino   uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	st.ctime, st.ino = sysStamp(fi)
	return st
}

func (a fileStamp) equal(b fileStamp) bool {
	return a.mod.Equal(b.mod) && a.size == b.size && a.ctime == b.ctime && a.ino == b.ino
}
