package gateway

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestOpenAISDK runs the official OpenAI Node SDK (scripts/sdk, installed by
// make deps) against the router in front of two simulated engines.
func TestOpenAISDK(t *testing.T) {
	node, err := exec.LookPath("node")
	_, modErr := os.Stat(filepath.Join("..", "scripts", "sdk", "node_modules", "openai"))
	if err != nil || modErr != nil {
		if os.Getenv("INFERA_REQUIRE_SDK") == "1" {
			t.Fatalf("node or scripts/sdk/node_modules missing (run make deps): %v %v", err, modErr)
		}
		t.Skip("node or the OpenAI SDK is not installed; run make deps")
	}
	_, e1 := startEngine(t, "--speedup", "50")
	_, e2 := startEngine(t, "--speedup", "50")
	_, r := startServe(t, "--workers", e1+","+e2)
	cmd := exec.Command(node, filepath.Join("..", "scripts", "sdk", "check.mjs"), r+"/v1", "sim-model")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("OpenAI SDK check failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// nodeSDK returns node and the scripts/sdk directory, skipping the test
// (or failing it when INFERA_REQUIRE_SDK=1) when they are not installed.
func nodeSDK(t *testing.T, modules ...string) (node, dir string) {
	t.Helper()
	dir = filepath.Join("..", "scripts", "sdk")
	node, err := exec.LookPath("node")
	for _, m := range modules {
		if _, e := os.Stat(filepath.Join(dir, "node_modules", m)); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		if os.Getenv("INFERA_REQUIRE_SDK") == "1" {
			t.Fatalf("node or scripts/sdk/node_modules missing (run make deps): %v", err)
		}
		t.Skip("node or the SDKs are not installed; run make deps")
	}
	return node, dir
}

// runSDKScript runs a scripts/sdk check against the router at base, with
// env added to its environment.
func runSDKScript(t *testing.T, node, dir, script, base, key string, env ...string) {
	t.Helper()
	cmd := exec.Command(node, filepath.Join(dir, script))
	cmd.Env = append(os.Environ(), "INFERA_BASE_URL="+base, "INFERA_MODEL=sim-model", "INFERA_API_KEY="+key, "INFERA_EXPECT_THINKING=1",
		"INFERA_ROUTER=1") // the router itself: /v1/models too
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed: %v\n%s", script, err, out)
	}
	t.Logf("%s", out)
}

// TestAnthropicAndResponsesSDKs runs the official Anthropic SDK
// (@anthropic-ai/sdk: messages.create, messages.stream, tool use over two
// turns, thinking, countTokens, the error shape) and the official OpenAI
// SDK's responses.create (plain, streamed, function tools, reasoning, the
// refusal of previous_response_id; in passthrough, follow-ups answered by
// the engine holding their previous response) through `infera serve` to simulated
// engines that reason and call tools, in both modes:
//   - conversion: the engines speak chat completions only (they answer
//     404 on /v1/messages), so every answer the SDKs accept was converted;
//   - passthrough: the engines serve /v1/messages and /v1/responses
//     themselves, and the router forwards the client's bytes.
//
// The key is checked (x-api-key for Anthropic, Bearer for OpenAI).
func TestAnthropicAndResponsesSDKs(t *testing.T) {
	node, dir := nodeSDK(t, filepath.Join("@anthropic-ai", "sdk"), "openai")
	for _, mode := range []struct {
		name, engineFlag, protocol string
		env                        []string
	}{
		{"conversion", "--reasoning", `{"reasoning_effort_mode":"map"}`, nil},
		{"passthrough", "--native-protocols", `{"anthropic_passthrough":true,"responses_passthrough":true}`, []string{"INFERA_RESPONSES_STORED=1"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			_, e1 := startEngine(t, "--speedup", "50", "--tool-calls", "--reasoning", mode.engineFlag)
			_, e2 := startEngine(t, "--speedup", "50", "--tool-calls", "--reasoning", mode.engineFlag)
			cfg := filepath.Join(t.TempDir(), "infera.json")
			if err := os.WriteFile(cfg, []byte(`{"protocol":`+mode.protocol+`}`), 0o644); err != nil {
				t.Fatal(err)
			}
			_, r := startServe(t, "--workers", e1+","+e2, "--api-key", "sdk-key", "--config", cfg)
			for _, script := range []string{"anthropic.mjs", "responses.mjs"} {
				runSDKScript(t, node, dir, script, r, "sdk-key", mode.env...)
			}
		})
	}
}

// TestSDKsReadRateLimitHeadersAndDoNotRetryASpentQuota runs
// scripts/sdk/limits.mjs (the official OpenAI and Anthropic Node SDKs at
// their default maxRetries of 2) against a user with an RPM and a monthly
// quota of 2 requests: both SDKs read the rate limit headers, and each
// raises RateLimitError for the spent quota at once. The router saw each
// refused request once: the SDKs did not retry.
func TestSDKsReadRateLimitHeadersAndDoNotRetryASpentQuota(t *testing.T) {
	node, dir := nodeSDK(t, filepath.Join("@anthropic-ai", "sdk"), "openai")
	_, eng := startEngine(t, "--speedup", "50")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 100},
			"quota": {"enabled": true, "windows": [{"period": "month", "max_requests": 2}]}}]},
		"users": [{"name": "sdk-limits", "keys": [%q]}]}`, hash))
	_, r := startServe(t, "--workers", eng, "--config", cfg)
	runSDKScript(t, node, dir, "limits.mjs", r, key)
	if n := metricF(t, r, `infera_user_rejections_total{user="sdk-limits"}`); n != 2 {
		t.Fatalf("the router refused %v requests, want the SDKs' 2 (no retries)", n)
	}
}
