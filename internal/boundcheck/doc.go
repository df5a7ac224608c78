// Package boundcheck checks what a multi-region run admitted against the
// cross-region bound the project promises: for every policy and subject,
// the regions together admit at most (1+ε)·(C + r·W) in any window of
// length W (token bucket), and at most (1+ε)·C in any one window of the
// policy (fixed window and sliding window counter: each aligned window;
// sliding log: any span of the window's length).
//
// The input is the admitted decisions of every node of every region, each
// with the instant it was recorded at. A recorded instant may differ from
// the instant the store decided by up to Config.Slack (a client records
// when the answer arrived; the store decided somewhere in between), so
// the check widens each token-bucket window by two slacks and narrows
// each policy window by two: a violation it reports is one no placement
// of the decisions within their slack explains. A violation names the
// policy, subject and window, what each region admitted inside it, and,
// when Config.Shares is given, the shares the regions held at its start.
//
// Check is a pure function of its input; it allocates O(decisions).
package boundcheck
