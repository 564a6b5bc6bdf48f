package tokenizer

import (
	"bytes"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

func TestCmd(t *testing.T) {
	h := loadQwen3(t)
	first := true
	f := func(args []string, stdin, want string) {
		t.Helper()
		var c Cmd
		p, err := kong.New(&c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse(append([]string{"--tokenizer", qwen3Dir}, args...)); err != nil {
			t.Fatalf("parse %v: %v", args, err)
		}
		var out bytes.Buffer
		c.Stdin, c.Stdout = strings.NewReader(stdin), &out
		if !first {
			c.loaded = h // Load runs once, for the first case; it is slow under -race
		}
		first = false
		if err := c.Run(); err != nil {
			t.Fatalf("run %v: %v", args, err)
		}
		if out.String() != want {
			t.Fatalf("run %v on %q:\n got %q\nwant %q", args, stdin, out.String(), want)
		}
	}
	// Ids checked against @lenml/tokenizers.
	f(nil, "Hello world<|im_start|>user\n  x   y\t\n\n", "9707 1879 151644 872 198 220 856 256 379 15799\ncount: 10\n")
	f(nil, "", "\ncount: 0\n")
	f([]string{"--chat", "--text"}, `[{"role":"user","content":"Hi"}]`,
		"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\n151644 872 198 13048 151645 198 151644 77091 198\ncount: 9\n")
	f([]string{"--chat", "--no-add-generation-prompt"}, `[{"role":"user","content":"Hi"}]`, "151644 872 198 13048 151645 198\ncount: 6\n")
	f([]string{"--chat", "--text"}, `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}}`,
		"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n151644 872 198 13048 151645 198 151644 77091 198 151667 271 151668 271\ncount: 13\n")
}

func TestCmdErrors(t *testing.T) {
	h := loadQwen3(t)
	for _, in := range []string{`{`, `{"messages":null}`, `[{"role":"user"}]`, `{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}`} {
		c := Cmd{Tokenizer: qwen3Dir, Chat: true, Stdin: strings.NewReader(in), Stdout: &bytes.Buffer{}, loaded: h}
		if err := c.Run(); err == nil {
			t.Errorf("input %q: want error", in)
		}
	}
	if err := (&Cmd{Tokenizer: t.TempDir(), Stdin: strings.NewReader("x"), Stdout: &bytes.Buffer{}}).Run(); err == nil {
		t.Error("want error for a directory without tokenizer.json")
	}
}
