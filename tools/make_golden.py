#!/usr/bin/env python3
"""Writes the golden fixture that checks chunkfuse against llama.cpp on the same GGUF.

Run with the reference venv (llama-cpp-python built from source, plus jinja2):
    /opt/cfref/bin/python tools/make_golden.py \
        [--model ~/.cache/chunkfuse/models/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--out tests/golden/smollm2_q4_1.json]
    .venv/bin/python tools/make_golden.py --model ~/.cache/chunkfuse/models/gemma-3-270m-q4_k_m.gguf \
        --out tests/golden/gemma3_270m_q4_k_m.json
    .venv/bin/python tools/make_golden.py --n-predict 16 \
        --model ~/.cache/chunkfuse/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --out tests/golden/qwen2.5_coder_0.5b_instruct_q4_k_m.json
    .venv/bin/python tools/make_golden.py \
        --model ~/.cache/chunkfuse/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --out tests/golden/qwen2.5_coder_1.5b_instruct_q4_k_m.json
A base model without tokenizer.chat_template (Gemma 3 270M) gets no chat cases; its greedy
and logits prompts are plain text, and it gets "long" cases (prompts past 512 tokens) so
that a sliding attention window is exercised; those are evaluated in ONE ubatch
(n_batch = n_ubatch = 1024), so llama.cpp's cache cells stay in position order.
The output is deterministic (fixed inputs, greedy decoding, single-batch evaluation,
sorted keys).

Fixture format (JSON object, format_version 1):
  format_version         1
  generator              "tools/make_golden.py"
  llama_cpp_python_version  e.g. "0.3.36"
  model                  {file, size, sha256}            the GGUF the fixture belongs to
  reference              {cpu, isa: [instruction-set flags of /proc/cpuinfo that ggml uses],
                          llama_system_info}   the machine and build that produced the logits:
                         llama.cpp's float order (and so its last bits) depends on the ISA its
                         ggml was built for (absent in fixtures made before issue 23, which
                         came from AVX-512 machines too)
  tokenize: [            llama.cpp's llama_tokenize on the vocabulary
    {name, text, add_special, parse_special,
     ids: [int],                                     Llama.tokenize(text, add_bos=add_special, special=parse_special)
     detok: str,                                     llama_token_to_piece(id, special=True) of each id, joined (detokenize below), UTF-8
     detok_plain: str}]                              the same with special=False
  chat: [                Jinja2 renderings of chat templates (HF settings: trim_blocks,
                         lstrip_blocks; bos_token "" since the tokenizer adds BOS itself;
                         tools=None, so Qwen's template takes its branch without tools)
    {name, family, template: "model" | "llama3_reference" | "mistral_reference",
     messages: [{role, content}], add_generation_prompt, text}]
  chat_templates         {name: jinja text} for the templates referenced above
                         ("model" is the file's tokenizer.chat_template)
  greedy: [              greedy decoding with llama.cpp (pure argmax over the logits, no
                         sampling, no repetition penalty, no stop at end-of-generation)
    {name, prompt (text), chat (bool: prompt is a rendered chat), prompt_ids,
     n_predict, output_ids, output_text (detokenize(output_ids, special=True), UTF-8 with
     replacement), margins: [top1 logit - top2 logit at each generated step]}]
     Prompts are tokenized with add_special=False, parse_special=True (base models:
     add_special=True, since they are trained with BOS and have no template adding it).
  logits: [              one batch evaluation of the whole prompt with logits_all=True
    {name, prompt, prompt_ids, top_k (10),
     positions: [{ids: [top_k ids, best first], logits: [their logits]}] one per prompt token,
     last_top50: {ids: [50], logits: [50]}}]
     Logits are rounded to 5 decimals.
  eval_settings          {n_ctx, n_threads, n_batch, n_ubatch, seed, use_extra_bufts (false: no AMX)}
"""
import argparse
import ctypes
import json
import os
import sys

import jinja2
import numpy as np
import llama_cpp

from benchlib import disable_llama_extra_buffers, sha256_of  # noqa: E402 (tools/ is this script's folder)

disable_llama_extra_buffers()

DEFAULT_MODEL = os.path.expanduser("~/.cache/chunkfuse/models/SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                           "smollm2_q4_1.json")
MUSIQUE = "/work/shared/datasets/musique_s.json"
N_CTX = 2048
N_THREADS = 2
N_BATCH = 512
N_PREDICT = 32

# Reference templates of the other families (as published with Llama 3 Instruct and
# Mistral 7B Instruct v0.1), rendered with Jinja2 so the built-in formatters can be
# checked against them too.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}")


def long_passage(llm, target_tokens=2000, item=0):
    """About `target_tokens` tokens of retrieved-context text from MuSiQue (item `item`)."""
    with open(MUSIQUE, encoding="utf-8") as f:
        data = json.load(f)
    text = "\n\n".join(c["text"] for c in data[item]["ctxs"])
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    if len(ids) > target_tokens:
        # Cut at the last space before the target so the passage ends on a word.
        prefix = detokenize(llm, ids[:target_tokens], False).decode("utf-8", errors="ignore")
        text = prefix[: prefix.rfind(" ")]
    return text


def tokenize_cases(passage):
    c = []

    def add(name, text, add_special=False, parse_special=False):
        c.append({"name": name, "text": text, "add_special": add_special, "parse_special": parse_special})

    add("empty", "")
    add("empty_add_special", "", add_special=True)
    add("english", "The quick brown fox jumps over the lazy dog.")
    add("english_add_special", "Hello world", add_special=True)
    add("sentence_punct", "Wait... what?! Really -- yes; (maybe) [not] {sure}: \"quoted\" 'single'.")
    add("contractions", "I'm sure you're right, he'll say it's what we've done; I'd've, don't, can't, y'all.")
    add("contractions_upper", "I'M SURE YOU'RE RIGHT, IT'S THEIR'S 'S 'T")
    add("digits", "1234567 and 3.14 and 2024-05-09 and 1,000,000 and 0x1F")
    add("digits_mixed", "abc123def 42nd 7th version2.0.1 v3 ①②③ ١٢٣ ½")
    add("python_code", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n")
    add("cpp_code", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;  // double\n\treturn v.size() > 2 ? 0 : -1;\n}\n")
    add("json_like", "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}")
    add("url_email", "See https://example.com/path?q=1&r=two#frag or mail me@example.org.")
    add("accents", "Café, naïve, résumé, façade, Ångström, Øresund, Straße, Dvořák.")
    add("combining_marks", "e\u0301 a\u0300 n\u0303 o\u0308 Z\u0335\u0358a\u0336l\u0337g\u0338o")
    add("cjk", "日本語のテキストと中文文本，还有한국어 문장도 있습니다。")
    add("emoji", "I love 🍕 and 🚀! 👩‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵, skin 👍🏽")
    add("rtl", "مرحبا بالعالم! שלום עולם. Mixed العربية with English.")
    add("greek_cyrillic", "Γειά σου Κόσμε — Привет, мир! Ελληνικά и русский.")
    add("devanagari_thai", "नमस्ते दुनिया। สวัสดีชาวโลก")
    add("spaces_multiple", "a  b   c    d     e")
    add("spaces_leading_trailing", "   leading and trailing   ")
    add("tabs_newlines", "line1\nline2\n\nline4\r\nline5\t\ttabbed\n\n\n")
    add("only_whitespace", " \n\t \n  ")
    add("single_space", " ")
    add("single_newline", "\n")
    add("unicode_spaces", "non\u00a0breaking\u2009thin\u3000ideographic\u2028sep")
    add("symbols", "~!@#$%^&*()_+-=[]{}|\\;:'\",.<>/?`€£¥©®™°±×÷")
    add("special_parsed", "<|im_start|>user\nhi<|im_end|>", parse_special=True)
    add("special_unparsed", "<|im_start|>user\nhi<|im_end|>", parse_special=False)
    add("special_parsed_add_special", "<|im_start|>user\nhi<|im_end|>", add_special=True, parse_special=True)
    add("special_adjacent", "<|im_end|><|im_start|>assistant\n<|endoftext|>x", parse_special=True)
    add("special_in_words", "a<|im_start|>b <|im_end|> c<file_sep>d<repo_name>", parse_special=True)
    add("special_partial", "<|im_start|<|im_end <im_start|> <|endoftext|", parse_special=True)
    add("chatml_prompt", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    add("repeated_chars", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa " + "=" * 50 + " " + "-" * 33)
    add("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious")
    add("mixed_case", "camelCase snake_case SCREAMING_CASE kebab-case PascalCase iPhone eBay")
    add("markdown", "# Title\n\n* item one\n* **bold** and _italic_\n\n```python\nx = 1\n```\n| a | b |\n|---|---|")
    add("musique_passage", passage)
    # Gemma's control and user-defined tokens (plain text for other vocabularies).
    add("gemma_turns_parsed", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", parse_special=True)
    add("gemma_turns_unparsed", "<start_of_turn>user\nhi<end_of_turn>", parse_special=False)
    add("gemma_bos_text", "<bos>text<eos> <pad>", parse_special=True)
    add("html_tags", "<table><tr><td>cell</td></tr></table><br/><div class=\"x\">y</div>")
    add("newline_runs", "a\n\n\n\n\nb\n\n\n\n\n\n\n\n\n\nc" + " " * 31 + "d")
    return c


def chat_cases():
    m = lambda role, content: {"role": role, "content": content}  # noqa: E731
    return [
        ("user_only", [m("user", "What is the capital of France?")]),
        ("with_system", [m("system", "You are a terse assistant."), m("user", "Hi")]),
        ("multi_turn", [m("user", "Name a color."), m("assistant", "Blue."), m("user", "Another one?")]),
        ("unicode_multiline", [m("user", "Translate:\n  «Bonjour» → 日本語?\n\nThanks 🙂 ")]),
        ("empty_content", [m("user", "")]),
        ("system_multi_turn", [m("system", "Answer in French."), m("user", "Hello"),
                               m("assistant", " Bonjour "), m("user", "  How are you?\n")]),
    ]


def render(template_text, messages, add_generation_prompt):
    # Hugging Face's settings for chat templates.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template_text).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token="", eos_token="</s>",
        tools=None)


# The /proc/cpuinfo flags that select ggml's CPU code paths (x86).
ISA_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
             "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def reference_machine():
    cpu, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not cpu:
                    cpu = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    info = llama_cpp.llama_print_system_info()
    return {"cpu": cpu, "isa": [f for f in ISA_FLAGS if f in flags],
            "llama_system_info": (info.decode() if isinstance(info, bytes) else str(info)).strip()}


def detokenize(llm, ids, special):
    """Llama.detokenize without its 32-byte piece buffer: llama-cpp-python 0.3.36 passes 32
    bytes to llama_token_to_piece and keeps nothing of a longer piece (the call returns minus
    the size it needs), e.g. Qwen2.5's " ==...=" (51 bytes); llama.cpp itself keeps it."""
    out, buf = b"", ctypes.create_string_buffer(64)
    for t in ids:
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, llama_cpp.llama_token(t), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(llm._model.vocab, llama_cpp.llama_token(t), buf, len(buf), 0, special)
        out += buf.raw[:n]
    # As Llama.detokenize: a leading space after BOS is dropped.
    if ids and ids[0] == llm.token_bos() and out[:1] == b" ":
        out = out[1:]
    return out


def topk(row, k):
    # Stable ordering: larger logit first, smaller id first on ties.
    order = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return [int(i) for i in order], [round(float(row[i]), 5) for i in order]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--n-predict", type=int, default=N_PREDICT,
                    help="tokens per greedy continuation (16 keeps a CI fixture of a bigger model quick)")
    args = ap.parse_args()

    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)

    def tok(text, add_special, parse_special):
        return vocab.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detok(ids, special):
        return detokenize(vocab, ids, special).decode("utf-8", errors="replace")

    out = {
        "format_version": 1,
        "generator": "tools/make_golden.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": {"file": os.path.basename(args.model), "size": os.path.getsize(args.model),
                  "sha256": sha256_of(args.model)},
        "reference": reference_machine(),
        "eval_settings": {"n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": N_BATCH, "seed": 0,
                          "use_extra_bufts": False},
    }

    # --- tokenization
    cases = tokenize_cases(long_passage(vocab))
    for c in cases:
        c["ids"] = tok(c["text"], c["add_special"], c["parse_special"])
        c["detok"] = detok(c["ids"], True)
        c["detok_plain"] = detok(c["ids"], False)
    out["tokenize"] = cases

    # --- chat templates
    model_template = vocab.metadata.get("tokenizer.chat_template")
    base_model = model_template is None  # e.g. Gemma 3 270M (pretrained, no template)
    templates = {"llama3_reference": LLAMA3_TEMPLATE, "mistral_reference": MISTRAL_TEMPLATE}
    if not base_model:
        templates["model"] = model_template
    out["chat_templates"] = {} if base_model else templates
    chats = []
    for tname, family in (() if base_model else
                          (("model", "chatml"), ("llama3_reference", "llama3"), ("mistral_reference", "mistral"))):
        for name, messages in chat_cases():
            for agp in (True, False):
                if not agp and name not in ("multi_turn", "user_only"):
                    continue
                try:
                    text = render(templates[tname], messages, agp)
                except jinja2.exceptions.TemplateError:
                    continue  # e.g. Mistral v0.1 rejects system messages
                chats.append({"name": name, "family": family, "template": tname, "messages": messages,
                              "add_generation_prompt": agp, "text": text})
    out["chat"] = chats

    # --- greedy decoding and logits
    n_batch = 1024 if base_model else N_BATCH
    out["eval_settings"]["n_batch"] = out["eval_settings"]["n_ubatch"] = n_batch
    long_text = long_passage(vocab, 700, item=1) if base_model else ""
    del vocab
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=N_CTX, n_threads=N_THREADS, n_batch=n_batch,
                          n_ubatch=n_batch, logits_all=True, seed=0, verbose=False)

    def chat_text(user):  # base models: the chat prompts are replaced below
        return "" if base_model else render(model_template, [{"role": "user", "content": user}], True)

    greedy_prompts = [
        ("plain_capital", "The capital of France is", False),
        ("plain_story", "Once upon a time, in a small village by the sea,", False),
        ("plain_code", "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n", False),
        ("plain_list", "Three primary colors are: 1.", False),
        ("plain_numbers", "1, 2, 3, 5, 8, 13,", False),
        ("chat_capital", chat_text("What is the capital of Germany?"), True),
        ("chat_explain", chat_text("Explain photosynthesis in one sentence."), True),
        ("chat_math", chat_text("What is 12 times 12?"), True),
        ("chat_translate", chat_text("Translate 'good morning' into Spanish."), True),
        ("chat_rag", chat_text("Context: Hannibal crossed the Alps in 218 BC with war elephants.\n\n"
                               "Question: In which year did Hannibal cross the Alps?"), True),
    ]
    if base_model:  # no chat template: plain-text prompts only, one of them past the window
        greedy_prompts = greedy_prompts[:5] + [
            ("plain_history", "The French Revolution began in 1789 when", False),
            ("plain_science", "Water boils at 100 degrees Celsius at sea level because", False),
            ("plain_qa", "Question: What is the largest planet in the Solar System?\nAnswer:", False),
            ("plain_rag", "Context: Hannibal crossed the Alps in 218 BC with war elephants.\n\n"
                          "Question: In which year did Hannibal cross the Alps?\nAnswer:", False),
            ("plain_recipe", "To make a simple tomato sauce, first", False),
            ("long_rag", long_text + "\n\nQuestion: Summarize the passages above in one sentence.\nAnswer:", False),
        ]
    greedy = []
    for name, prompt, is_chat in greedy_prompts:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=base_model, special=True)
        llm.reset()
        llm.eval(ids)
        generated, margins = [], []
        for _ in range(args.n_predict):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            best, vals = topk(row, 2)
            generated.append(best[0])
            margins.append(round(vals[0] - vals[1], 5))
            llm.eval([best[0]])
        greedy.append({"name": name, "prompt": prompt, "chat": is_chat, "prompt_ids": ids,
                       "n_predict": args.n_predict, "output_ids": generated,
                       "output_text": detokenize(llm, generated, True).decode("utf-8", errors="replace"),
                       "margins": margins})
    out["greedy"] = greedy

    logit_prompts = [
        ("plain_short", "The history of the Roman Empire spans more than a thousand years, from the founding of the city"),
        ("chat_question", chat_text("Which planet is known as the Red Planet, and why?")),
        ("rag_context", "Document: thriller television series developed by bryan fuller for nbc. the series is based on "
                        "characters and elements appearing in thomas harris' novels \"red dragon\", \"hannibal\" and "
                        "\"hannibal rising\" with focus on the relationship between fbi special investigator will graham "
                        "and dr. hannibal lecter.\nQuestion: Who developed the series?\nAnswer:"),
    ]
    if base_model:
        logit_prompts[1] = ("plain_question", "Which planet is known as the Red Planet, and why? The answer is")
        logit_prompts.append(("long_passage", long_text))
    logits = []
    for name, prompt in logit_prompts:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=base_model, special=True)
        assert len(ids) <= n_batch
        llm.reset()
        llm.eval(ids)  # one batch: every position's logits come from the same evaluation
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        positions = []
        for p in range(len(ids)):
            top_ids, top_vals = topk(scores[p], 10)
            positions.append({"ids": top_ids, "logits": top_vals})
        last_ids, last_vals = topk(scores[len(ids) - 1], 50)
        logits.append({"name": name, "prompt": prompt, "prompt_ids": ids, "top_k": 10,
                       "positions": positions, "last_top50": {"ids": last_ids, "logits": last_vals}})
    out["logits"] = logits

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} tokenize, {len(chats)} chat, {len(greedy)} greedy, "
          f"{len(logits)} logits cases", file=sys.stderr)


if __name__ == "__main__":
    main()
