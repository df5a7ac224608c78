// Package operatortoken reads the operator token file that the
// coordinator checks bearer tokens against and quotactl sends a token
// from, and says where such a token may travel in plaintext.
//
// The file holds one "ROLE:TOKEN" per line, ROLE being read or write and
// TOKEN at least 16 characters without blanks; '#' starts a comment line.
// A client also accepts a file holding one bare token. Tokens are secrets:
// LoadFile creates a missing file with mode 0600, and LoopbackAddr is the
// one test of whether an address keeps a plaintext token on the machine.
//
// The package depends on the standard library only, so the CLI links
// none of the coordinator's servers.
package operatortoken
