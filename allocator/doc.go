// Package allocator splits one policy's global budget into per-region
// shares. It is pure: values in, shares out, no clock, no I/O, no logging,
// and the result for a region never depends on the order of the input.
// The coordinator, the operator dry-run and the simulator all call Split.
//
// # Units
//
// A share is a fraction of the policy's global budget: a region with share
// f enforces capacity f·C and refill f·r. Demand is expressed the same way,
// as a fraction of the policy's global rate r (1 = the whole budget). The
// budget to split is B = 1 + ε, where ε ≥ 0 is the overcommit the operator
// opted into.
//
// # Invariants
//
// For every result of Split (within Tolerance, summed in any order):
//
//   - Σ shares ≤ 1 + ε, even when the step limit stops a shrink half way:
//     growth is scaled down to fit the room the shrinks left;
//   - every live region keeps at least its minimum m(R), and Σ m(R) ≤ 1 is
//     validated, so the minimums can always be honoured;
//   - a live pinned region gets exactly its pin, a dead region (lease
//     expired) gets exactly its minimum and its demand is ignored;
//   - every other share moves from Current toward its target by at most
//     MaxStep and never past the target. The only exceptions are forced by
//     the rules above: a share below its minimum is raised to it at once,
//     one above its cap is lowered to it, and when Current itself breaks
//     Σ ≤ 1 + ε (a new pin, a changed ε) the shares above their target
//     shrink further, as far as needed, because safety wins over smoothness.
//
// # The maths
//
// Target computes the ideal split. Dead regions and live pinned regions are
// fixed first; the rest R = B − Σ fixed is divided among the free regions,
// each bounded by [Min, Max] (Max = 0 means no cap). Every algorithm is
// "find the level λ ≥ 0 with Σ clamp(a_i + λ·s_i, lo_i, hi_i) = R": each
// term is piecewise linear and nondecreasing in λ, so the solver sorts the
// breakpoints, finds the segment holding R and solves that segment's linear
// equation exactly.
//
//   - Static: a_i = 0, s_i = weight. Shares proportional to weight.
//   - Proportional: a_i = 0, s_i = demand (weights when nobody has demand).
//     Shares proportional to demand; a region without demand gets Min.
//   - MaxMinFair: weighted water-filling. First s_i = weight and
//     hi_i = min(Max, max(Min, demand)): every region gets min(demand,
//     λ·weight), so a small region is served in full and the big ones share
//     what is left equally per unit of weight. If the budget is larger than
//     the total demand, the spare is spread in a second pass by weight
//     (a_i = first-pass share, s_i = weight, up to Max) so that nothing sits
//     idle.
//
// When every free region is capped (Σ Max < R) the rest of the budget stays
// unallocated: no region may take it.
//
// Split then moves each free share from Current toward its target:
// the dead band keeps Current when |target − Current| < DeadBand, and the
// step limit bounds |new − Current| by MaxStep. If the result sums above B,
// the growing regions' growth is scaled by the common factor that makes it
// fit; Current ≤ B guarantees that scaling growth suffices.
//
// Smooth is the exponential moving average the coordinator applies to
// observed demand before it calls Split: prev + α·(observed − prev).
//
// # Concurrency and zero values
//
// Every function is safe for concurrent use; nothing is shared. The zero
// Params means MaxMinFair, no overcommit, no step limit and no dead band.
// A zero Region is a dead region with weight 1 and no minimum (its Name
// must still be set).
package allocator
