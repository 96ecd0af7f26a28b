// Package memcolo is the Go SDK of memcolo for elastic applications (M3, EuroSys'21
// §4): a Client registers with `memcolo agent` over its Unix socket, runs the
// application's handlers on low/high/top pressure notifications (upper layer first,
// then the Go runtime through debug.FreeOSMemory and debug.SetMemoryLimit), reports
// the bytes reclaimed and the time taken, reconnects when the agent restarts, and
// feeds the allow-rate gate of the adaptive allocation protocol (M3 §4.2).
//
// The wire protocol (versioned JSON lines) is docs/protocol.md; Encode and the
// Decode functions write and read exactly what the reference implementation
// (Rust memcolo-proto) does, checked against the shared vectors in sdk/testvectors.
//
// Package cache (github.com/memcolo/memcolo/sdk/go/cache) is an elastic slab cache
// (M3's Go-Cache) that returns whole slabs to the OS on signals.
package memcolo
