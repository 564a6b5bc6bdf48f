package gateway

import (
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
