package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotacoord/quota/internal/operatorclient"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type options struct {
	addr, tokenFile, output string
	tlsCA, tlsCert, tlsKey  string
	tls, insecurePlaintext  bool
	timeout                 time.Duration
	stdout                  io.Writer
	// dialer, when set, opens the connections to the coordinator in
	// place of the default TCP dialer (tests route a remote address to a
	// loopback listener with it).
	dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// run executes quotactl with args; tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(&options{stdout: stdout})
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

// newRootCmd is quotactl with its connection flags and every subcommand,
// which o configures and which write to o.stdout.
func newRootCmd(o *options) *cobra.Command {
	root := &cobra.Command{
		Use:           "quotactl",
		Short:         "Operate the quota coordinator",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f := root.PersistentFlags()
	f.StringVar(&o.addr, "coordinator", "127.0.0.1:8091", "coordinator operator API address")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (write:TOKEN, read:TOKEN or a bare token)")
	f.BoolVar(&o.tls, "tls", false, "use TLS (implied by --tls-ca, --tls-cert)")
	f.StringVar(&o.tlsCA, "tls-ca", "", "CA certificate that signed the coordinator's certificate")
	f.StringVar(&o.tlsCert, "tls-cert", "", "client certificate for mTLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "client key for mTLS")
	f.BoolVar(&o.insecurePlaintext, "insecure-plaintext", false, "send the bearer token without TLS to a non-loopback --coordinator (anyone on the path can read it)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of each call")
	root.AddCommand(newPolicyCmd(o), newAllocCmd(o), newRebalanceCmd(o), newDryRunCmd(o),
		newFreezeCmd(o), newUnfreezeCmd(o), newPinCmd(o), newUnpinCmd(o), newWeightCmd(o), newMinimumCmd(o),
		newAuditCmd(o), newEtcdAuthCmd(o), newRegionCmd(o))
	return root
}

// operatorCall is one subcommand's work: calls on the operator API with
// the subcommand's arguments, under the --timeout deadline.
type operatorCall func(ctx context.Context, c quotav1.OperatorClient, args []string) error

// call turns fn into a RunE that dials the coordinator, runs fn and
// reports a gRPC status as "Code: message".
func (o *options) call(fn operatorCall) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		conn, err := o.dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
		defer cancel()
		if err := fn(ctx, quotav1.NewOperatorClient(conn), args); err != nil {
			if s, ok := status.FromError(err); ok {
				return fmt.Errorf("%s: %s", s.Code(), s.Message())
			}
			return err
		}
		return nil
	}
}

// withOutput adds -o (table or json) to a command that prints a reply.
func (o *options) withOutput(c *cobra.Command) *cobra.Command {
	c.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table or json")
	return c
}

// acknowledged is a command of exactly n arguments whose call returns
// nothing to show; it prints "ok" when the call succeeds.
func (o *options) acknowledged(use, short string, n int, fn operatorCall) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(n),
		RunE: o.call(func(ctx context.Context, c quotav1.OperatorClient, args []string) error {
			if err := fn(ctx, c, args); err != nil {
				return err
			}
			fmt.Fprintln(o.stdout, "ok")
			return nil
		})}
}

// number parses a numeric argument, naming it in the error.
func number(s, what string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a number", what, s)
	}
	return v, nil
}

// dial connects to the coordinator as the connection flags say.
func (o *options) dial() (*grpc.ClientConn, error) {
	return operatorclient.Dial(operatorclient.Config{Addr: o.addr, TokenFile: o.tokenFile, TLS: o.tls,
		TLSCA: o.tlsCA, TLSCert: o.tlsCert, TLSKey: o.tlsKey, InsecurePlaintext: o.insecurePlaintext, Dialer: o.dialer})
}

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
// printMismatches lists, for each region whose nodes disagree on policies
// or subject naming, every node's fingerprint, so an operator can find
// the node that differs.
func printMismatches(w io.Writer, regions map[string][]*quotav1.NodeAck) {
	for _, r := range slices.Sorted(maps.Keys(regions)) {
		fmt.Fprintf(w, "config mismatch: region %s is not counted as live (it holds its minimum) until its nodes agree:", r)
		for _, n := range regions[r] {
			fp := n.Fingerprint
			if fp == "" {
				fp = "-"
			}
			fmt.Fprintf(w, " %s=%s", n.Node, fp)
		}
		fmt.Fprintln(w)
	}
}

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
