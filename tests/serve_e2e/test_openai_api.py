"""End-to-end: the real `chunkfuse serve` on loopback, driven by the official openai client and
by curl. Run: .venv-serve/bin/python -m unittest discover -s tests/serve_e2e -v
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_helpers as h  # noqa: E402

# `chunkfuse ask`'s prompt (src/fusion/rag_prompt.h): its default system message, the user
# content "Question: <q>", one chunk per passage "Title: <t>\n<text>" (+ the "\n\n" separator
# the engine adds to every document, as ask does to every passage). The chats below send no
# system message: a chat with documents gets ask's own (serve/prompt_layout.h with_rag_system),
# so the two prompts are the same only if the server applies it.
PASSAGES = [
    {"title": "Lake Orta", "text": "Lake Orta is a lake in northern Italy. The island of San Giulio lies in its centre."},
    {"title": "Orta San Giulio", "text": "Orta San Giulio is a town on the eastern shore of Lake Orta, "
                                         "known for its basilica and narrow streets."},
    {"title": "Monte Rosa", "text": "Monte Rosa is a mountain massif in the Alps whose meltwater feeds several "
                                    "lakes of Piedmont."},
]
QUESTION = "Which island lies in the centre of Lake Orta?"


def document_text(p):
    return "Title: %s\n%s" % (p["title"], p["text"])


def rag_messages(question=QUESTION):
    return [{"role": "user", "content": "Question: " + question}]


class OpenAIApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server()
        cls.client = h.openai_client(cls.server)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.stop_cleanly()

    def chat(self, messages, **kw):
        kw.setdefault("max_tokens", 24)
        kw.setdefault("temperature", 0)
        return self.client.chat.completions.create(model=self.model, messages=messages, **kw)

    def test_models_list_names_the_served_model(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertTrue(models[0].id)
        self.assertEqual(self.client.models.retrieve(models[0].id).id, models[0].id)

    def test_chat_completion_and_usage(self):
        r = self.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=12)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content.strip())
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        u = r.usage
        self.assertGreater(u.prompt_tokens, 5)
        self.assertGreaterEqual(u.completion_tokens, 1)
        self.assertLessEqual(u.completion_tokens, 12)
        if r.choices[0].finish_reason == "length":
            self.assertEqual(u.completion_tokens, 12)
        self.assertEqual(u.total_tokens, u.prompt_tokens + u.completion_tokens)
        ext = r.model_extra["chunkfuse"]
        self.assertEqual(ext["prompt_tokens"], u.prompt_tokens)
        self.assertGreater(ext["timings_ms"]["ttft"], 0)
        # cached_tokens (issue 58 item 5): what a full prefill reused is its prefix hit ...
        self.assertEqual(u.prompt_tokens_details.cached_tokens, ext["prefix_hit_tokens"])
        # ... and a cold one, with the prefix cache off, reused nothing.
        cold = self.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=4,
                         extra_body={"fusion": {"method": "full", "prefix_cache": False}})
        self.assertEqual(cold.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(cold.model_extra["chunkfuse"]["prefilled_tokens"], cold.usage.prompt_tokens)

    def test_same_greedy_request_twice_is_identical_and_hits_the_prefix_cache(self):
        msgs = [{"role": "system", "content": "You are a terse assistant who answers in one short sentence."},
                {"role": "user", "content": "Name a large mammal that lives in the ocean."}]
        a = self.chat(msgs)
        b = self.chat(msgs)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertEqual(a.usage.prompt_tokens, b.usage.prompt_tokens)
        self.assertGreater(b.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertGreater(b.model_extra["chunkfuse"]["prefix_hit_tokens"], 0)
        self.assertEqual(b.usage.prompt_tokens_details.cached_tokens, b.model_extra["chunkfuse"]["prefix_hit_tokens"])

    def test_completion(self):
        r = self.client.completions.create(model=self.model, prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.choices[0].text.strip())
        self.assertLessEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_chat_stream_equals_the_non_streamed_greedy_answer(self):
        msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
        whole = self.chat(msgs, max_tokens=20)
        chunks = list(self.chat(msgs, max_tokens=20, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertGreater(sum(1 for c in chunks if c.choices and c.choices[0].delta.content), 1)  # really streamed
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finish, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])  # include_usage: the last chunk carries the usage
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertGreaterEqual(chunks[-1].usage.prompt_tokens_details.cached_tokens, 0)  # present in the usage chunk
        self.assertEqual(len({c.id for c in chunks}), 1)

    def test_completion_stream_equals_the_non_streamed_answer(self):
        kw = dict(model=self.model, prompt="Once upon a time", max_tokens=12, temperature=0)
        whole = self.client.completions.create(**kw)
        text = "".join(c.choices[0].text for c in self.client.completions.create(stream=True, **kw) if c.choices)
        self.assertEqual(text, whole.choices[0].text)

    def test_stop_sequence_ends_the_answer(self):
        msgs = [{"role": "user", "content": "Count from one to ten."}]
        full = self.chat(msgs, max_tokens=30).choices[0].message.content
        stop = next((s for s in ("\n", ",", ".", " ") if s in full[1:]), None)
        self.assertIsNotNone(stop, full)
        stopped = self.chat(msgs, max_tokens=30, stop=[stop, "never-said"])
        self.assertEqual(stopped.choices[0].finish_reason, "stop")
        self.assertEqual(stopped.choices[0].message.content, full[:full.index(stop)])

    def test_fields_that_change_the_answer_are_refused_unless_off(self):
        import openai
        msgs = [{"role": "user", "content": "Say yes."}]
        # The SDK's off values pass (issue 59) ...
        r = self.chat(msgs, max_tokens=4, n=1, logprobs=False, response_format={"type": "text"}, tools=[])
        self.assertTrue(r.choices[0].message.content)
        # ... and what the engine does not implement is a 400 naming the field, not ignored.
        for kw in ({"logprobs": True}, {"response_format": {"type": "json_object"}}, {"n": 2},
                   {"logit_bias": {"1": 5}}, {"tools": [{"type": "function", "function": {"name": "f"}}]}):
            with self.assertRaises(openai.BadRequestError) as cm:
                self.chat(msgs, max_tokens=4, **kw)
            self.assertEqual(cm.exception.body["param"], next(iter(kw)), cm.exception.body)
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model=self.model, prompt="Hi", max_tokens=4, echo=True)
        self.assertEqual(cm.exception.body["param"], "echo")

    def test_chunks_register_get_use_delete(self):
        texts = [document_text(p) for p in PASSAGES[:2]]
        status, reg = self.server.post("/v1/chunks", {"texts": texts})
        self.assertEqual(status, 200, reg)
        ids = [c["id"] for c in reg["data"]]
        self.assertEqual(len(set(ids)), 2)
        status, info = self.server.get("/v1/chunks/" + ids[0])
        self.assertEqual(status, 200, info)
        self.assertGreater(info["n_tokens"], 10)
        self.assertTrue(info["cached"])
        self.assertIn("Lake Orta", info["text"])

        fusion = {"method": "full", "prefix_cache": True}
        by_id = self.chat(rag_messages(), extra_body={"documents": [{"id": i} for i in ids], "fusion": fusion})
        inline = self.chat(rag_messages(), extra_body={"documents": texts, "fusion": fusion})
        self.assertEqual(by_id.choices[0].message.content, inline.choices[0].message.content)
        self.assertEqual(by_id.usage.prompt_tokens, inline.usage.prompt_tokens)
        ext = by_id.model_extra["chunkfuse"]
        self.assertEqual(ext["chunk_order"], ids)  # same passage text, same id, inline or registered
        self.assertEqual(inline.model_extra["chunkfuse"]["chunk_order"], ids)

        # A reuse request finds both registered caches in the store.
        reuse = self.chat(rag_messages(), extra_body={"documents": [{"id": i} for i in ids],
                                                      "fusion": {"method": "reuse", "ratio": 0}})
        self.assertEqual(reuse.model_extra["chunkfuse"]["chunk_hits"], 2)
        self.assertEqual(reuse.model_extra["chunkfuse"]["chunk_misses"], 0)
        # Both chunks came from the store and none was recomputed: every prompt token the fused
        # prefill did not run is cached, at least the first chunk's.
        cached = reuse.usage.prompt_tokens_details.cached_tokens
        self.assertEqual(cached, reuse.usage.prompt_tokens - reuse.model_extra["chunkfuse"]["prefilled_tokens"])
        self.assertGreaterEqual(cached, info["n_tokens"])

        status, gone = self.server.request("DELETE", "/v1/chunks/" + ids[1])
        self.assertEqual((status, gone["deleted"]), (200, True))
        self.assertEqual(self.server.get("/v1/chunks/" + ids[1])[0], 404)
        status, err = self.server.post("/v1/chat/completions", {"model": self.model, "messages": rag_messages(),
                                                                 "documents": [{"id": ids[1]}]})
        self.assertEqual(status, 404, err)

    def test_fused_answer_equals_chunkfuse_ask(self):
        with tempfile.TemporaryDirectory() as tmp:
            passages = os.path.join(tmp, "passages.jsonl")
            with open(passages, "w") as f:
                for p in PASSAGES:
                    f.write(json.dumps(p) + "\n")
            for method, ratio in (("full", 1.0), ("epic", 0.3), ("cacheblend", 0.15)):
                with self.subTest(method=method, ratio=ratio):
                    ask = subprocess.run(
                        [h.binary_path(), "ask", "-m", h.model_path(), "-t", str(h.threads()), "--passages", passages,
                         "-q", QUESTION, "--method", method, "--ratio", str(ratio), "-n", "24",
                         "--store", os.path.join(tmp, "store"), "--json"],
                        capture_output=True, text=True, timeout=300)
                    self.assertEqual(ask.returncode, 0, ask.stderr)
                    want = json.loads(ask.stdout)
                    r = self.chat(rag_messages(), max_tokens=24, extra_body={
                        "documents": [document_text(p) for p in PASSAGES],
                        "fusion": {"method": method, "ratio": ratio}})
                    self.assertEqual(r.choices[0].message.content, want["answer"])
                    self.assertEqual(r.usage.prompt_tokens, want["prompt_tokens"])
                    if method != "full":
                        self.assertEqual(r.model_extra["chunkfuse"]["recomputed_tokens"], want["recomputed_tokens"])

    def test_auto_reports_its_choice_and_equals_chunkfuse_ask(self):
        """Quality on demand (issue 26): the server and `ask` take the same decision for the same
        request, the response says what it chose (streamed too), and auto with a ratio is a 400."""
        with tempfile.TemporaryDirectory() as tmp:
            passages = os.path.join(tmp, "passages.jsonl")
            with open(passages, "w") as f:
                for p in PASSAGES:
                    f.write(json.dumps(p) + "\n")
            ask = subprocess.run(
                [h.binary_path(), "ask", "-m", h.model_path(), "-t", str(h.threads()), "--passages", passages,
                 "-q", QUESTION, "--method", "auto", "--quality", "0.8", "-n", "24",
                 "--store", os.path.join(tmp, "store"), "--json"],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(ask.returncode, 0, ask.stderr)
            want = json.loads(ask.stdout)
        fusion = {"method": "auto", "quality": 0.8}
        docs = [document_text(p) for p in PASSAGES]
        # ask computes missing chunk caches inside the step, timed apart; the server prices them
        # (issue 60 item 2) and answers a request on cold caches with full prefill: warm them.
        self.chat(rag_messages(), max_tokens=1, extra_body={"documents": docs, "fusion": {"method": "reuse"}})
        r = self.chat(rag_messages(), max_tokens=24, extra_body={"documents": docs, "fusion": fusion})
        choice = r.model_extra["chunkfuse"]["auto"]
        for key in ("method", "ratio", "predicted_quality", "threshold", "decision_ms", "steps_run", "calibrated", "trace"):
            self.assertIn(key, choice)
        self.assertEqual((choice["method"], choice["ratio"]), (want["auto"]["method"], want["auto"]["ratio"]))
        self.assertEqual(r.choices[0].message.content, want["answer"])
        # A step answers when its prediction reaches the policy's threshold for the target.
        self.assertTrue(choice["method"] == "full" or choice["predicted_quality"] >= choice["threshold"], choice)
        self.assertEqual(len(choice["trace"]), choice["steps_run"])
        stream = self.client.chat.completions.create(model=self.model, messages=rag_messages(), max_tokens=24,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"documents": docs, "fusion": fusion})
        ext = [c.model_extra.get("chunkfuse") for c in stream if c.model_extra.get("chunkfuse")]
        self.assertTrue(ext and ext[-1]["auto"]["method"] == choice["method"], ext)
        status, err = self.server.post("/v1/chat/completions", {
            "model": self.model, "messages": rag_messages(), "documents": docs,
            "fusion": {"method": "auto", "quality": 0.8, "ratio": 0.3}})
        self.assertEqual(status, 400, err)
        self.assertEqual(err["error"]["param"], "fusion.ratio")

    def test_curl_stream(self):
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say hello to the reader."}],
                "max_tokens": 12, "temperature": 0}
        whole = self.chat(body["messages"], max_tokens=12).choices[0].message.content
        out = subprocess.run(["curl", "-sS", "-N", "--fail-with-body", "-H", "Content-Type: application/json",
                              "-d", json.dumps(dict(body, stream=True)), self.server.url + "/v1/chat/completions"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr + out.stdout)
        events = [e for e in out.stdout.split("\n\n") if e.strip()]
        self.assertTrue(all(e.startswith("data: ") for e in events), events)
        self.assertEqual(events[-1], "data: [DONE]")
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        self.assertEqual({c["object"] for c in chunks}, {"chat.completion.chunk"})
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        self.assertEqual(text, whole)

    def test_health_and_metrics(self):
        self.chat([{"role": "user", "content": "Hi"}], max_tokens=2)
        status, health = self.server.get("/health")
        self.assertEqual((status, health["status"]), (200, "ok"))
        m = self.server.metrics()
        self.assertGreaterEqual(m["chunkfuse_requests_total"], 1)
        self.assertGreaterEqual(m["chunkfuse_ttft_seconds_count"], 1)
        self.assertEqual(m['chunkfuse_ttft_seconds_bucket{le="+Inf"}'], m["chunkfuse_ttft_seconds_count"])
        self.assertIn('chunkfuse_store_bytes{tier="memory"}', m)
        self.assertIn("chunkfuse_queue_length", m)
        # vLLM's names (issue 58 item 5), labelled with the served model, equal to ours.
        label = '{model_name="%s"}' % self.client.models.list().data[0].id
        self.assertEqual(m["vllm:prompt_tokens_total" + label], m["chunkfuse_prompt_tokens_total"])
        self.assertEqual(m["vllm:generation_tokens_total" + label], m["chunkfuse_completion_tokens_total"])
        self.assertEqual(m["vllm:time_to_first_token_seconds_count" + label], m["chunkfuse_ttft_seconds_count"])
        # The usage's cached_tokens summed: reused K/V only, so at most what was not prefilled
        # (a chunk computed for its request skips the prompt's forward pass but is not a hit).
        self.assertEqual(m["vllm:prefix_cache_hits_total" + label], m["chunkfuse_cached_tokens_total"])
        self.assertLessEqual(m["chunkfuse_cached_tokens_total"],
                             m["chunkfuse_prompt_tokens_total"] - m["chunkfuse_prefilled_tokens_total"])
        self.assertIn("vllm:num_requests_running" + label, m)


if __name__ == "__main__":
    unittest.main()
