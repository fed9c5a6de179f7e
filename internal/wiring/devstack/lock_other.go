//go:build !unix

package devstack

import "os"

// tryLock takes no lock where flock is missing: dev is a Unix tool here, and
// on other systems only the port check keeps a second dev out.
func tryLock(*os.File, bool) error { return nil }

func unlock(*os.File) error { return nil }
