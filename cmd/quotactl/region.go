package main

import (
	"context"

	"github.com/spf13/cobra"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// newRegionCmd is "region retire REGION".
func newRegionCmd(o *options) *cobra.Command {
	region := &cobra.Command{Use: "region", Short: "Regions of the deployment"}
	region.AddCommand(o.acknowledged("retire REGION",
		"Leave a region out of every allocation (its nodes must be stopped); it takes part again if a node registers", 1,
		func(ctx context.Context, c quotav1.OperatorClient, a []string) error {
			_, err := c.RetireRegion(ctx, &quotav1.RetireRegionRequest{Region: a[0]})
			return err
		}))
	return region
}
