// Package jinja renders the Jinja2 subset that Hugging Face chat templates
// use (tokenizer_config.json's chat_template).
//
// Semantics follow @huggingface/jinja, the reference renderer for chat
// templates, rather than Python's Jinja2 wherever the two differ, so that
// rendered prompts are byte-identical to it. The notable differences from
// Python Jinja2, all deliberate:
//
//   - The template is preprocessed as transformers does (trim_blocks and
//     lstrip_blocks on, one trailing newline removed).
//   - None and undefined values print as nothing; booleans print as
//     "true"/"false" (Options.PythonPrint writes None, True and False as
//     Python's str does; the tokenizer sets it); floats with an integral
//     value print as "1.0".
//   - str.strip/lstrip/rstrip ignore their argument and strip whitespace
//     (Options.PythonStrip honours it, as Python does; the tokenizer sets it).
//   - Arrays and objects print as JSON (tojson without indent)
//     (Options.PythonPrint writes them, and the string filter turns them
//     into, Python's repr: "{'k': [None, True]}"; the tokenizer sets it).
//   - == and != compare numbers, strings and booleans as JavaScript's ==
//     does ('1' == 1 is true; Options.PythonCompare compares as Python
//     does, '1' == 1 false; the tokenizer sets it); lists and dicts
//     compare by value, as in Python.
//   - + with a string operand writes the other one as a string (Python
//     raises TypeError for str + dict or str + list).
//   - Dict literals take string keys only, and a for loop refuses to iterate
//     a string (Python iterates its characters).
//   - A break or continue discards the output of the current iteration.
//   - Object key order is insertion order (array-index-like keys first, as in
//     JavaScript objects).
//
// Where Python's jinja2 (in the environment transformers, and so vLLM,
// renders chat templates with) differs otherwise, jinja/ follows Python:
// scripts/jinjaref/pyref.py renders real templates (testdata/templates)
// with it, and TestPythonJinjaReference compares byte for byte.
//
// The package owns parsing, evaluation and value conversion. It knows nothing
// about tokenizers or chat messages: callers pass variables as Values.
//
// Templates are immutable after Parse and safe for concurrent Render calls.
// Each Template pools its render states: strings, arrays, objects and scopes
// built while rendering live in arenas that are reset, not freed, so a warm
// render allocates nothing (arena.go explains why that is safe). Callers
// that build variables for every render can do the same with Object.Reset
// and List.
// Bad templates and bad input return errors; parsing refuses templates
// nested more than 200 levels deep (blocks, parentheses, calls, and the
// links of operator, filter and attribute chains), and evaluation is
// bounded in recursion depth, steps and output size, so hostile templates
// cannot hang or crash the process.
package jinja
