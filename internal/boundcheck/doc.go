// Package boundcheck checks what a multi-region run admitted against the
// cross-region bound the project promises: for every policy and subject,
// the regions together admit at most (1+ε)·(C + r·W) in any window of
// length W (token bucket; by default W is one refill step 1/r, one
// refill time C/r, ten of them, and the whole run), and at most (1+ε)·C
// in any one window of the policy (fixed window and sliding window
// counter: each aligned window; sliding log: any span of the window's
// length).
//
// The input is the admitted decisions of every node of every region, each
// with the instant it was recorded at and, when known, the instant its
// check was sent: the store decided somewhere in between. A recorded
// instant may differ from the store's clock by up to Config.Slack. A
// decision counts in a window only when every instant it can have been
// decided at lies inside the window, so a violation the check reports is
// one no placement of the decisions explains, and a slow answer (a paused
// node's) blunts the check only for its own decision. Token-bucket
// windows end at each decision's latest instant; window-policy windows
// are aligned as the stores align them (sliding log: any span of the
// window's length). A violation names the policy, subject and window,
// what each region admitted inside it, the decisions themselves (region,
// node, the share each was decided at; at most MaxListed), and, when
// Config.Shares is given, the shares the regions held at its start and
// end.
//
// Check is a pure function of its input; it allocates O(decisions) and
// takes O(decisions × decisions per window) time.
package boundcheck
