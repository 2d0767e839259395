"""LangChain's RAG chain, unmodified, against `chunkfuse serve --match-chunks` (issue 27).

The chain is the one LangChain's RAG tutorial builds: retrieved Documents formatted with
"\n\n".join(doc.page_content ...) into the prompt, a ChatPromptTemplate, ChatOpenAI pointed at
the server. Nothing in it knows about chunk caches; the server finds the passages in the
message. The second question gets the same passages in another order (as a retriever ranking
them differently would) and is served from their caches: its time to first token drops.

  pip install langchain-openai==1.7.4       # also brings langchain-core
  build/chunkfuse serve --match-chunks --port 8080 &
  python examples/match_chunks_langchain.py [--base-url http://127.0.0.1:8080/v1]
"""
import argparse
import json
import time

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_openai import ChatOpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
ap.add_argument("--passages", default="examples/passages.jsonl")
args = ap.parse_args()

docs = [Document(page_content="%s\n%s" % (d.get("title", ""), d["text"]))
        for d in (json.loads(line) for line in open(args.passages) if line.strip())]
order = {"forward": docs, "reversed": docs[::-1]}

prompt = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using the context. Answer briefly."),
    ("human", "Context:\n\n{context}\n\nQuestion: {question}"),
])
llm = ChatOpenAI(base_url=args.base_url, api_key="unused", model="any", temperature=0, max_tokens=48)


def format_docs(ds):
    return "\n\n".join(d.page_content for d in ds)  # LangChain's tutorial, as written


def chain_for(retrieved):
    retriever = RunnableLambda(lambda _question: retrieved)  # stands in for a vector store
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


for question, ranking in [("Who designed the lighthouse near Port Elwen?", "forward"),
                          ("When was the lighthouse first lit?", "reversed")]:
    t0 = time.time()
    first, pieces = None, []
    for piece in chain_for(order[ranking]).stream(question):
        if first is None and piece:
            first = time.time() - t0
        pieces.append(piece)
    print("%-48s passages %-8s first token after %5.0f ms" % (question, ranking, 1000 * (first or 0)))
    print("   ", "".join(pieces).strip())
