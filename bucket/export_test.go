package bucket

// SetRedisNow makes r pass now() (microseconds) to its scripts in place of
// Redis TIME. Tests only: it drives the differential test.
func SetRedisNow(r *Redis, now func() int64) { r.now = now }
