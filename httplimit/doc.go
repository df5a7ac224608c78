// Package httplimit is net/http middleware that asks a regional node (via a
// Checker such as *client.Client) before every request and answers the
// HTTP contract for callers:
//
//   - a denied request gets 429 Too Many Requests, a Retry-After header in
//     whole seconds rounded up (at least 1), and a JSON body
//     {"error":{"code":"RATE_LIMITED","message":...,"policy":...,"retry_after_seconds":...}};
//   - every decided response, allowed or denied, carries the IETF RateLimit
//     and RateLimit-Policy header fields in the form of
//     draft-ietf-httpapi-ratelimit-headers (versions 08 to 10):
//     RateLimit-Policy: "exports";q=50;w=60 and RateLimit: "exports";r=42;t=5,
//     one list member per checked policy; r is the remaining budget and t
//     the seconds until the bucket is full again, rounded up.
//
// The subject comes from a SubjectFunc: Header (any header value, hashed
// by the node), Tenant (a header that already holds a valid subject) or
// ClientIP. ClientIP reads a forwarding header only when the connection's
// peer is one of the configured trusted proxies (Proxies.Trusted), and
// then only the one header those proxies set (Proxies.Header: Forwarded,
// or X-Forwarded-For or another address list), never one that no trusted
// proxy wrote: behind a proxy that appends X-Forwarded-For only, a
// client's own Forwarded header passes through untouched and would
// otherwise let it pick its subject. The client is the rightmost hop that
// is not a trusted proxy; everything left of it may be client-written and
// is never read. A Forwarded header with an unterminated quoted string or
// a parameter without "=" is an error, so that client text cannot swallow
// the hop a proxy appends after it.
//
// Identify derives the subject in the documented order (tenant, then API
// key, then user, then client address), folding the case of e-mail
// addresses and grouping IPv6 clients by prefix, and hashes it.
//
// # Policies per request
//
// Config.Tiers and Config.Tier choose the policies per request (free,
// pro, enterprise), from the request or from a claim an authenticating
// middleware put in its context, so one handler serves every plan.
//
// # Several dimensions
//
// Config.Dimensions charges each request to further subjects beside its
// own (the client address, the endpoint with Endpoint, the whole API with
// Fixed), in one all-or-nothing CheckAll: a request is admitted when every
// dimension admits it and then charged to every one, and a request one
// dimension refuses is charged to none, so a client refused for its
// address does not spend its API key's budget or the endpoint's. The
// RateLimit fields carry the single most restrictive result
// (MostRestrictive): the denial with the longest wait, or the least
// remaining budget.
//
// Units: Retry-After, t and w are whole seconds; q and r are cost units of
// the policy.
//
// A Limiter is safe for concurrent use; it starts no goroutines. The zero
// Limiter is not usable: build one with New.
package httplimit
