package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotacoord/quota/internal/operatortoken"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type options struct {
	addr, tokenFile, output string
	tlsCA, tlsCert, tlsKey  string
	tls                     bool
	timeout                 time.Duration
	stdout                  io.Writer
}

// run executes quotactl with args; tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &options{stdout: stdout}
	root := &cobra.Command{
		Use:           "quotactl",
		Short:         "Operate the quota coordinator",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	f := root.PersistentFlags()
	f.StringVar(&o.addr, "coordinator", "127.0.0.1:8091", "coordinator operator API address")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (write:TOKEN, read:TOKEN or a bare token)")
	f.BoolVar(&o.tls, "tls", false, "use TLS (implied by --tls-ca, --tls-cert)")
	f.StringVar(&o.tlsCA, "tls-ca", "", "CA certificate that signed the coordinator's certificate")
	f.StringVar(&o.tlsCert, "tls-cert", "", "client certificate for mTLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "client key for mTLS")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of each call")

	withClient := func(fn func(ctx context.Context, c quotav1.OperatorClient, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			conn, err := o.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, o.timeout)
			defer cancel()
			if err := fn(cctx, quotav1.NewOperatorClient(conn), args); err != nil {
				if s, ok := status.FromError(err); ok {
					return fmt.Errorf("%s: %s", s.Code(), s.Message())
				}
				return err
			}
			return nil
		}
	}
	read := func(c *cobra.Command) *cobra.Command {
		c.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table or json")
		return c
	}

	pol := &cobra.Command{Use: "policy", Short: "Apply, list and show policies"}
	var file string
	apply := &cobra.Command{
		Use: "apply -f FILE", Short: "Validate and store a policy document (own YAML or Envoy config)", Args: cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
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
	pol.AddCommand(apply,
		read(&cobra.Command{
			Use: "list", Short: "List policies", Args: cobra.NoArgs,
			RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
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
		}),
		read(&cobra.Command{
			Use: "show NAME", Short: "Show one policy, its document and controls", Args: cobra.ExactArgs(1),
			RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
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
		}),
	)

	alloc := &cobra.Command{Use: "alloc", Short: "Show allocations"}
	alloc.AddCommand(read(&cobra.Command{
		Use: "show [POLICY]", Short: "Shares, demand and acknowledged epochs per region", Args: cobra.MaximumNArgs(1),
		RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
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
				fmt.Fprintln(w, "POLICY\tEPOCH\tPHASE\tREGION\tSHARE\tTARGET\tSAFE\tLIVE\tACKED\tOFFERED/S\tADMITTED/S\tPINNED\tNODES (ACKED)")
				for _, a := range r.Allocations {
					for _, s := range a.Regions {
						fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.4f\t%.4f\t%.4f\t%v\t%d\t%.2f\t%.2f\t%v\t%s\n", a.Policy, a.Epoch, a.Phase, s.Region, s.Share, s.Target, s.Safe, s.Live, s.AckedEpoch, s.Offered, s.Admitted, s.Pinned, nodeList(s.Nodes))
					}
				}
			})
		}),
	}))

	reb := &cobra.Command{Use: "rebalance", Short: "Rebalance control"}
	reb.AddCommand(&cobra.Command{
		Use: "now", Short: "Run a rebalance round on the leader now", Args: cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
			r, err := c.RebalanceNow(ctx, &quotav1.RebalanceNowRequest{})
			if err != nil {
				return err
			}
			fmt.Fprintf(o.stdout, "published: %s\n", orNone(r.Published))
			fmt.Fprintf(o.stdout, "waiting: %s\n", orNone(r.Waiting))
			return nil
		}),
	})

	dry := read(&cobra.Command{
		Use: "dry-run POLICY", Short: "Show the shares the next round would propose, without publishing", Args: cobra.ExactArgs(1),
		RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
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
					fmt.Fprintf(w, "predicted by the simulator (%.0fs of the hottest reported subject): overshoot 1s=%.4f 10s=%.4f 60s=%.4f, under-admission %.4f, max Σ shares %.4f\n",
						p.SimulatedS, p.Overshoot_1S, p.Overshoot_10S, p.Overshoot_60S, p.UnderAdmission, p.MaxShareSum)
				}
			})
		}),
	})

	simple := func(use, short string, n int, call func(ctx context.Context, c quotav1.OperatorClient, args []string) error) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(n),
			RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
				if err := call(ctx, c, args); err != nil {
					return err
				}
				fmt.Fprintln(o.stdout, "ok")
				return nil
			})}
	}
	number := func(s, what string) (float64, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a number", what, s)
		}
		return v, nil
	}
	freeze := simple("freeze POLICY", "Stop moving a policy's shares", 1, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Freeze(ctx, &quotav1.FreezeRequest{Policy: a[0]})
		return err
	})
	unfreeze := simple("unfreeze POLICY", "Let the coordinator move a policy's shares again", 1, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Unfreeze(ctx, &quotav1.UnfreezeRequest{Policy: a[0]})
		return err
	})
	pin := simple("pin POLICY REGION SHARE", "Fix a region's default share", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "share")
		if err != nil {
			return err
		}
		_, err = c.Pin(ctx, &quotav1.PinRequest{Policy: a[0], Region: a[1], Share: v})
		return err
	})
	unpin := simple("unpin POLICY REGION", "Return a pinned region to the allocator", 2, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		_, err := c.Unpin(ctx, &quotav1.UnpinRequest{Policy: a[0], Region: a[1]})
		return err
	})
	weight := simple("weight POLICY REGION W", "Set a region's weight", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "weight")
		if err != nil {
			return err
		}
		_, err = c.SetWeight(ctx, &quotav1.SetWeightRequest{Policy: a[0], Region: a[1], Weight: v})
		return err
	})
	minimum := simple("minimum POLICY REGION M", "Set a region's minimum (safe) share", 3, func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
		v, err := number(a[2], "minimum")
		if err != nil {
			return err
		}
		_, err = c.SetMinimum(ctx, &quotav1.SetMinimumRequest{Policy: a[0], Region: a[1], Minimum: v})
		return err
	})

	audit := &cobra.Command{Use: "audit", Short: "The operator audit log"}
	var limit uint32
	auditList := read(&cobra.Command{
		Use: "list", Short: "List recent operator actions, newest first", Args: cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c quotav1.OperatorClient, _ []string) error {
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
	auditList.Flags().Uint32Var(&limit, "limit", 50, "entries to show (at most 1000)")
	audit.AddCommand(auditList)

	root.AddCommand(pol, alloc, reb, dry, freeze, unfreeze, pin, unpin, weight, minimum, audit)
	return root.ExecuteContext(ctx)
}

func (o *options) dial() (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if o.tls || o.tlsCA != "" || o.tlsCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.tlsCA != "" {
			pem, err := os.ReadFile(o.tlsCA)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", o.tlsCA)
			}
			tc.RootCAs = pool
		}
		if o.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
			if err != nil {
				return nil, err
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.tokenFile != "" {
		data, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, err
		}
		tok, err := operatortoken.ForClient(data)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: tok, secure: creds.Info().SecurityProtocol == "tls"}))
	}
	return grpc.NewClient(o.addr, opts...)
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so that tokens work on loopback
// without TLS; use --tls across machines.
func (b bearer) RequireTransportSecurity() bool { return false }

func (o *options) print(m proto.Message, table func(*tabwriter.Writer)) error {
	switch o.output {
	case "json":
		data, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(m)
		if err != nil {
			return err
		}
		// Re-indent through encoding/json for stable output.
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		out, _ := json.MarshalIndent(v, "", "  ")
		_, err = fmt.Fprintln(o.stdout, string(out))
		return err
	case "table", "":
		w := tabwriter.NewWriter(o.stdout, 0, 4, 2, ' ', 0)
		table(w)
		return w.Flush()
	default:
		return fmt.Errorf("-o %q: want table or json", o.output)
	}
}

func kv(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%g", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "; ")
}

// nodeList renders a region's nodes as "id(epoch)", a dead node marked
// with "†".
func nodeList(nodes []*quotav1.NodeAck) string {
	if len(nodes) == 0 {
		return "-"
	}
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		mark := ""
		if !n.Live {
			mark = "†"
		}
		parts[i] = fmt.Sprintf("%s%s(%d)", n.Node, mark, n.AckedEpoch)
	}
	return strings.Join(parts, " ")
}
