// Package logbuf is a bounded, concurrency-safe in-memory sink for the
// output of processes and goroutines that tests start (a node's log, a
// command's stdout), to read back while they still run.
//
// A Buffer keeps the first Max bytes written (DefaultMax when Max is 0) and
// counts the rest as dropped, so a chatty process cannot grow a test's
// memory without bound. The zero Buffer is ready to use; a Buffer is safe
// for concurrent Write and String calls.
package logbuf
