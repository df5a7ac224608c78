package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

// newPolicyCmd is "policy apply|list|show".
func newPolicyCmd(o *options) *cobra.Command {
	pol := &cobra.Command{Use: "policy", Short: "Apply, list and show policies"}
	pol.AddCommand(newPolicyApplyCmd(o), newPolicyListCmd(o), newPolicyShowCmd(o))
	return pol
}

func newPolicyApplyCmd(o *options) *cobra.Command {
	var file string
	apply := &cobra.Command{
		Use: "apply -f FILE", Short: "Validate and store a policy document (own YAML or Envoy config)", Args: cobra.NoArgs,
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
			if file == "" {
				return errors.New("policy apply: -f FILE is required")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			r, err := c.ApplyPolicy(ctx, &quotav1.ApplyPolicyRequest{Filename: file, Document: data})
			if err != nil {
				return err
			}
			fmt.Fprintf(o.stdout, "stored document %s: %s\n", r.Doc, strings.Join(r.Policies, ", "))
			return nil
		}),
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "policy file")
	return apply
}

func newPolicyListCmd(o *options) *cobra.Command {
	return o.withOutput(&cobra.Command{
		Use: "list", Short: "List policies", Args: cobra.NoArgs,
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
			r, err := c.ListPolicies(ctx, &quotav1.ListPoliciesRequest{})
			if err != nil {
				return err
			}
			return o.print(r, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tDOC\tSUBJECT\tCAPACITY\tRATE/S\tOVERCOMMIT\tFAILURE\tFROZEN")
				for _, p := range r.Policies {
					fmt.Fprintf(w, "%s\t%s\t%s\t%g\t%g\t%g\t%s\t%v\n", p.Name, p.Doc, p.Subject, p.Capacity, p.RefillPerSecond, p.Overcommit, p.FailureMode, p.Frozen)
				}
			})
		}),
	})
}

func newPolicyShowCmd(o *options) *cobra.Command {
	return o.withOutput(&cobra.Command{
		Use: "show NAME", Short: "Show one policy, its document and controls", Args: cobra.ExactArgs(1),
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
			r, err := c.ShowPolicy(ctx, &quotav1.ShowPolicyRequest{Name: args[0]})
			if err != nil {
				return err
			}
			return o.print(r, func(w *tabwriter.Writer) {
				p := r.Policy
				fmt.Fprintf(w, "name:\t%s\ndoc:\t%s\nsubject:\t%s\ncapacity:\t%g\nrate/s:\t%g\novercommit:\t%g\nfrozen:\t%v\n", p.Name, p.Doc, p.Subject, p.Capacity, p.RefillPerSecond, p.Overcommit, r.Control.GetFrozen())
				fmt.Fprintf(w, "pins:\t%s\nweights:\t%s\nminimums:\t%s\n", kv(r.Control.GetPins()), kv(r.Control.GetWeights()), kv(r.Control.GetMinimums()))
				fmt.Fprintf(w, "--- document\n%s", r.Document)
			})
		}),
	})
}

// newAllocCmd is "alloc show [POLICY]".
func newAllocCmd(o *options) *cobra.Command {
	alloc := &cobra.Command{Use: "alloc", Short: "Show allocations"}
	alloc.AddCommand(o.withOutput(&cobra.Command{
		Use: "show [POLICY]", Short: "Shares, demand and acknowledged epochs per region", Args: cobra.MaximumNArgs(1),
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
			req := &quotav1.ShowAllocationRequest{}
			if len(args) == 1 {
				req.Policy = args[0]
			}
			r, err := c.ShowAllocation(ctx, req)
			if err != nil {
				return err
			}
			return o.print(r, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "leader: %s\n", r.Leader)
				fmt.Fprintln(w, "POLICY\tEPOCH\tPHASE\tREGION\tSHARE\tTARGET\tSAFE\tLIVE\tACKED\tOFFERED/S\tADMITTED/S\tPINNED\tCONFIG\tNODES (ACKED)")
				mismatched := map[string][]*quotav1.NodeAck{}
				for _, a := range r.Allocations {
					for _, s := range a.Regions {
						config := "ok"
						if s.ConfigMismatch {
							config = "MISMATCH"
							mismatched[s.Region] = s.Nodes
						}
						fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.4f\t%.4f\t%.4f\t%v\t%d\t%.2f\t%.2f\t%v\t%s\t%s\n", a.Policy, a.Epoch, a.Phase, s.Region, s.Share, s.Target, s.Safe, s.Live, s.AckedEpoch, s.Offered, s.Admitted, s.Pinned, config, nodeList(s.Nodes))
					}
				}
				printMismatches(w, mismatched)
			})
		}),
	}))
	return alloc
}

// newRebalanceCmd is "rebalance now".
func newRebalanceCmd(o *options) *cobra.Command {
	reb := &cobra.Command{Use: "rebalance", Short: "Rebalance control"}
	reb.AddCommand(&cobra.Command{
		Use: "now", Short: "Run a rebalance round on the leader now", Args: cobra.NoArgs,
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
			r, err := c.RebalanceNow(ctx, &quotav1.RebalanceNowRequest{})
			if err != nil {
				return err
			}
			fmt.Fprintf(o.stdout, "published: %s\n", orNone(r.Published))
			fmt.Fprintf(o.stdout, "waiting: %s\n", orNone(r.Waiting))
			return nil
		}),
	})
	return reb
}

// newDryRunCmd is "dry-run POLICY".
func newDryRunCmd(o *options) *cobra.Command {
	return o.withOutput(&cobra.Command{
		Use: "dry-run POLICY", Short: "Show the shares the next round would propose, without publishing", Args: cobra.ExactArgs(1),
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
			r, err := c.DryRun(ctx, &quotav1.DryRunRequest{Policy: args[0]})
			if err != nil {
				return err
			}
			return o.print(r, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "policy %s at epoch %d; %d subject overrides proposed\n", r.Policy, r.Epoch, r.Overrides)
				if r.Note != "" {
					fmt.Fprintf(w, "note: %s\n", r.Note)
				}
				fmt.Fprintln(w, "REGION\tCURRENT\tPROPOSED\tCHANGE\tDEMAND")
				for _, s := range r.Regions {
					fmt.Fprintf(w, "%s\t%.4f\t%.4f\t%+.4f\t%.3f\n", s.Region, s.Current, s.Proposed, s.Proposed-s.Current, s.Demand)
				}
				if p := r.Prediction; p != nil {
					fmt.Fprintf(w, "predicted by the simulator (%.0fs of the hottest reported subject): overshoot 1s=%.4f 10s=%.4f 60s=%.4f window=%.4f, under-admission %.4f, max Σ shares %.4f\n",
						p.SimulatedS, p.Overshoot_1S, p.Overshoot_10S, p.Overshoot_60S, p.OvershootWindow, p.UnderAdmission, p.MaxShareSum)
				}
			})
		}),
	})
}

// newFreezeCmd is "freeze POLICY".
func newFreezeCmd(o *options) *cobra.Command {
	return o.acknowledged("freeze POLICY", "Stop moving a policy's shares", 1, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Freeze(ctx, &quotav1.FreezeRequest{Policy: a[0]})
		return err
	})
}

// newUnfreezeCmd is "unfreeze POLICY".
func newUnfreezeCmd(o *options) *cobra.Command {
	return o.acknowledged("unfreeze POLICY", "Let the coordinator move a policy's shares again", 1, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Unfreeze(ctx, &quotav1.UnfreezeRequest{Policy: a[0]})
		return err
	})
}

// newPinCmd is "pin POLICY REGION SHARE".
func newPinCmd(o *options) *cobra.Command {
	return o.acknowledged("pin POLICY REGION SHARE", "Fix a region's default share", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "share")
		if err != nil {
			return err
		}
		_, err = c.Pin(ctx, &quotav1.PinRequest{Policy: a[0], Region: a[1], Share: v})
		return err
	})
}

// newUnpinCmd is "unpin POLICY REGION".
func newUnpinCmd(o *options) *cobra.Command {
	return o.acknowledged("unpin POLICY REGION", "Return a pinned region to the allocator", 2, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Unpin(ctx, &quotav1.UnpinRequest{Policy: a[0], Region: a[1]})
		return err
	})
}

// newWeightCmd is "weight POLICY REGION W".
func newWeightCmd(o *options) *cobra.Command {
	return o.acknowledged("weight POLICY REGION W", "Set a region's weight", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "weight")
		if err != nil {
			return err
		}
		_, err = c.SetWeight(ctx, &quotav1.SetWeightRequest{Policy: a[0], Region: a[1], Weight: v})
		return err
	})
}

// newMinimumCmd is "minimum POLICY REGION M".
func newMinimumCmd(o *options) *cobra.Command {
	return o.acknowledged("minimum POLICY REGION M", "Set a region's minimum (safe) share", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "minimum")
		if err != nil {
			return err
		}
		_, err = c.SetMinimum(ctx, &quotav1.SetMinimumRequest{Policy: a[0], Region: a[1], Minimum: v})
		return err
	})
}

// newAuditCmd is "audit list [--limit N]".
func newAuditCmd(o *options) *cobra.Command {
	audit := &cobra.Command{Use: "audit", Short: "The operator audit log"}
	var limit uint32
	list := o.withOutput(&cobra.Command{
		Use: "list", Short: "List recent operator actions, newest first", Args: cobra.NoArgs,
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
			r, err := c.ListAudit(ctx, &quotav1.ListAuditRequest{Limit: limit})
			if err != nil {
				return err
			}
			return o.print(r, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "AT\tACTOR\tACTION\tPOLICY\tDETAIL")
				for _, e := range r.Entries {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.At.AsTime().Format(time.RFC3339), e.Actor, e.Action, e.Policy, e.Detail)
				}
			})
		}),
	})
	list.Flags().Uint32Var(&limit, "limit", 50, "entries to show (at most 1000)")
	audit.AddCommand(list)
	return audit
}
