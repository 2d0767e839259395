"""An unmodified OpenAI client that stuffs retrieved passages into its message, as LangChain's
"stuff" chain does ("\n\n".join(doc.page_content for doc in docs)), run against
`chunkfuse serve --match-chunks`. The second question reuses every passage's chunk cache
although the passages come in another order; `chunkfuse.passages` in the raw response says
how many were matched, hit and computed.

  build/chunkfuse serve --match-chunks --port 8080 &
  .venv-serve/bin/python examples/match_chunks_openai.py [--base-url http://127.0.0.1:8080/v1]
"""
import argparse
import json

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
ap.add_argument("--passages", default="examples/passages.jsonl")
args = ap.parse_args()

docs = [json.loads(line) for line in open(args.passages) if line.strip()]
passages = ["%s\n%s" % (d.get("title", ""), d["text"]) for d in docs]
client = OpenAI(base_url=args.base_url, api_key="unused")


def ask(question, order):
    context = "\n\n".join(passages[i] for i in order)  # what a stuff chain sends
    raw = client.chat.completions.with_raw_response.create(
        model="any", temperature=0, max_tokens=48,
        messages=[{"role": "system", "content": "Answer the question using the context. Answer briefly."},
                  {"role": "user", "content": "Context:\n\n" + context + "\n\nQuestion: " + question}])
    extra = json.loads(raw.text)["chunkfuse"]
    answer = raw.parse().choices[0].message.content
    print("%-60s ttft %6.0f ms  passages %s" % (question, extra["timings_ms"]["ttft"], extra.get("passages")))
    print("   ", answer.strip())


n = len(passages)
ask("Who designed the lighthouse near Port Elwen?", list(range(n)))
ask("When was the lighthouse first lit?", list(reversed(range(n))))
