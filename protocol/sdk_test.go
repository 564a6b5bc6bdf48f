package protocol

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestOfficialSDKsParseConvertedAnswers runs the official Anthropic and
// OpenAI Node SDKs (scripts/sdk, installed by make deps) against a front
// door built on this package and a simulated chat engine: every answer and
// stream the SDKs accept here went through the conversion.
func TestOfficialSDKsParseConvertedAnswers(t *testing.T) {
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "scripts", "sdk")
	if d := os.Getenv("INFERA_SDK_DIR"); d != "" { // to try other SDK versions
		dir = d
	}
	_, e1 := os.Stat(filepath.Join(dir, "node_modules", "@anthropic-ai", "sdk"))
	_, e2 := os.Stat(filepath.Join(dir, "node_modules", "openai"))
	if err != nil || e1 != nil || e2 != nil {
		if os.Getenv("INFERA_REQUIRE_SDK") == "1" {
			t.Fatalf("node or scripts/sdk/node_modules missing (run make deps): %v %v %v", err, e1, e2)
		}
		t.Skip("node or the SDKs are not installed; run make deps")
	}
	opts := DefaultOptions()
	opts.Reasoning.Mode = ReasoningMap // exercise thinking blocks and reasoning items
	base := startGateway(t, opts)
	for _, script := range []string{"anthropic.mjs", "responses.mjs"} {
		t.Run(script, func(t *testing.T) {
			cmd := exec.Command(node, filepath.Join(dir, script))
			cmd.Env = append(os.Environ(), "INFERA_BASE_URL="+base, "INFERA_MODEL=claude-sim", "INFERA_API_KEY=test-key", "INFERA_EXPECT_THINKING=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s failed: %v\n%s", script, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

// TestAnthropicSDKMessageThreadsAreRefused runs scripts/sdk/threads.mjs: the
// Anthropic SDK's toolRunner sends a thread field by default and, on its
// second turn, only the tool results, counting on the server to hold the
// conversation. The front door holds none: it refuses the thread
// (thread_unsupported_request) and the SDK falls back to the full history.
// The field was dropped, and the engine got the tool results alone.
func TestAnthropicSDKMessageThreadsAreRefused(t *testing.T) {
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "scripts", "sdk")
	if d := os.Getenv("INFERA_SDK_DIR"); d != "" {
		dir = d
	}
	if _, e := os.Stat(filepath.Join(dir, "node_modules", "@anthropic-ai", "sdk")); err != nil || e != nil {
		t.Skip("node or the SDKs are not installed; run make deps")
	}
	base := startGateway(t, DefaultOptions())
	cmd := exec.Command(node, filepath.Join(dir, "threads.mjs"))
	cmd.Env = append(os.Environ(), "INFERA_BASE_URL="+base, "INFERA_MODEL=claude-sim", "INFERA_API_KEY=test-key")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("threads.mjs failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
