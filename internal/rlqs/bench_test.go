package rlqs

import (
	"context"
	"strconv"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
)

// BenchmarkReportsAndRounds measures a node's side of RLQS: handling one
// report message of 100 buckets (one per tenant) from each of 10 streams,
// then one round that leases and assigns all 1,000 buckets on the
// in-process store. ns/op is per report entry plus its share of a round.
func BenchmarkReportsAndRounds(b *testing.B) {
	set, err := policy.Parse("edge.yaml", []byte(edgePolicies))
	if err != nil {
		b.Fatal(err)
	}
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Policies: func() *policy.Set { return set }, Subjects: policy.EnvoySubjects{PlainKeys: []string{"tenant"}},
		Share: func(string, string) float64 { return 1 }, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	var streams []*stream
	for range 10 {
		ss, err := srv.open()
		if err != nil {
			b.Fatal(err)
		}
		streams = append(streams, ss)
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := range 100 {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "t" + strconv.Itoa(i)}},
			TimeElapsed: durationpb.New(1e9), NumRequestsAllowed: 5, NumRequestsDenied: 1})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 1000 {
		for _, ss := range streams {
			if err := srv.handle(ss, rep); err != nil {
				b.Fatal(err)
			}
			for len(ss.out) > 0 {
				<-ss.out
			}
		}
		srv.Step(context.Background())
	}
}
