package upstream

import (
	"fmt"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

func benchSplit(strategy config.SplitStrategy) *config.SplitProxy {
	return &config.SplitProxy{Enabled: true, Strategy: strategy, Proxies: []config.Proxy{
		{Name: "gpt", Address: "http://a", Weight: 2, ModelRules: []string{"gpt-*", "o1*", "o3*"}, Failover: true},
		{Name: "claude", Address: "http://b", Weight: 1, ModelRules: []string{"*claude*"}},
		{Local: true, Weight: 5, ModelRules: []string{"qwen*", "llama*"}},
		{Name: "backup", Address: "http://c", Weight: 0, Failover: true},
	}}
}

func benchMembers(n int) []*Member {
	ms := make([]*Member, n)
	for i := range ms {
		m := &Member{name: fmt.Sprintf("m%d", i), cancel: func() {}}
		m.report.Store(&report{at: time.Now(), cap: Capacity{Free: 10 + i, Models: []ModelCapacity{
			{Name: "llama-3-70b", Free: 10 + i}, {Name: "qwen2.5-72b-instruct", Free: 10 + i}, {Name: "deepseek*", Free: 1},
		}}})
		ms[i] = m
	}
	return ms
}

func BenchmarkPlan(b *testing.B) {
	model := []byte("Qwen2.5-72B-Instruct")
	for _, st := range []config.SplitStrategy{config.SplitWeight, config.SplitPrefix} {
		b.Run(string(st), func(b *testing.B) {
			sp := benchSplit(st)
			var s Splitter
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]int, 0, 8)
				for pb.Next() {
					dst = Plan(dst[:0], sp, model, s.Next())
				}
			})
		})
	}
}

func BenchmarkPick(b *testing.B) {
	p := NewPoller()
	defer p.Close()
	p.cfg.Store(&config.GlobalScheduling{Enabled: true, StaleAfterMS: 60000, MinFree: 1})
	ms := benchMembers(4)
	p.members.Store(&ms)
	model := []byte("Qwen2.5-72B-Instruct")
	b.ReportAllocs()
	for b.Loop() {
		if p.Pick(model) == nil {
			b.Fatal("no pick")
		}
	}
}
