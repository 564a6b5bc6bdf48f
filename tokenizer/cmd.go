package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/infera/infera/jinja"
)

// Cmd is the `infera tokenize` command: it prints the token ids of stdin
// (a plain prompt, after the tokenizer's prompt prefix, or a chat),
// space separated on one line, then the count. It is a debugging aid for
// checking that the router tokenizes prompts as the engines do.
type Cmd struct {
	Tokenizer string `help:"Model directory holding tokenizer.json and tokenizer_config.json." required:"" type:"existingdir" env:"INFERA_TOKENIZER"`
	Chat      bool   `help:"Treat stdin as a chat: a JSON messages array, or an object with messages, tools, add_generation_prompt and chat_template_kwargs. It is rendered with the chat template, then tokenized." default:"false" env:"INFERA_TOKENIZE_CHAT"`
	Text      bool   `help:"Also print the text that was tokenized (the rendered prompt with --chat), followed by a line break." default:"false" env:"INFERA_TOKENIZE_TEXT"`
	GenPrompt bool   `name:"add-generation-prompt" help:"With --chat and a bare messages array: end the prompt with the assistant turn opener." default:"true" negatable:"" env:"INFERA_TOKENIZE_ADD_GENERATION_PROMPT"`

	// Stdin and Stdout default to the process's; tests replace them.
	Stdin  io.Reader `kong:"-"`
	Stdout io.Writer `kong:"-"`

	loaded *HF // preloaded tokenizer (tests)
}

// chatRequest is the object form of --chat input.
type chatRequest struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
}

// Run executes the command.
func (c *Cmd) Run() error {
	in, out := c.Stdin, c.Stdout
	if in == nil {
		in = os.Stdin
	}
	if out == nil {
		out = os.Stdout
	}
	h := c.loaded
	if h == nil {
		var err error
		if h, err = Load(c.Tokenizer); err != nil {
			return err
		}
	}
	input, err := io.ReadAll(io.LimitReader(in, 64<<20))
	if err != nil {
		return fmt.Errorf("cannot read stdin: %w", err)
	}
	text := input
	var ids []uint32
	if c.Chat {
		if text, err = c.render(h, input); err != nil {
			return err
		}
		ids = h.Encode(nil, text)
	} else {
		// A plain prompt, as the router and the engine encode one: after
		// the post-processor's special tokens (a BOS), if any.
		ids = EncodePrompt(h, nil, text)
	}
	w := bufio.NewWriter(out)
	if c.Text {
		w.Write(text)
		w.WriteByte('\n')
	}
	var num []byte
	for i, id := range ids {
		if i > 0 {
			w.WriteByte(' ')
		}
		num = strconv.AppendUint(num[:0], uint64(id), 10)
		w.Write(num)
	}
	fmt.Fprintf(w, "\ncount: %d\n", len(ids))
	return w.Flush()
}

func (c *Cmd) render(h *HF, input []byte) ([]byte, error) {
	input = bytes.TrimSpace(input)
	if len(input) > 0 && input[0] == '[' {
		return h.RenderChatJSON(nil, input, nil, c.GenPrompt, nil)
	}
	var req chatRequest
	if err := json.Unmarshal(input, &req); err != nil {
		return nil, fmt.Errorf("cannot parse chat input: %w", err)
	}
	if len(req.Messages) == 0 {
		return nil, errors.New("chat input has no messages")
	}
	addGen := c.GenPrompt
	if req.AddGenerationPrompt != nil {
		addGen = *req.AddGenerationPrompt
	}
	var extra *jinja.Object
	if len(req.ChatTemplateKwargs) > 0 && string(req.ChatTemplateKwargs) != "null" {
		kw, err := jinja.FromJSON(req.ChatTemplateKwargs)
		if err != nil || kw.Kind() != jinja.KindObject {
			return nil, fmt.Errorf("chat_template_kwargs must be a JSON object")
		}
		extra = kw.Object()
	}
	tools := req.Tools
	if string(tools) == "null" {
		tools = nil
	}
	return h.RenderChatJSON(nil, req.Messages, tools, addGen, extra)
}
