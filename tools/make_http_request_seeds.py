#!/usr/bin/env python3
"""Seed inputs for fuzz/http_request_fuzz.cpp: one valid request per route.

Usage: python3 tools/make_http_request_seeds.py OUT_DIR

An input is one byte naming the route (its index in http_request_fuzz.cpp's kRoutes, in the
same order as ROUTES below), then the body (POST) or the last path segment (GET/DELETE).
"""
import json
import os
import sys

ROUTES = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/chunks", "POST /v1/documents",
          "POST /v1/retrieve", "GET /v1/chunks/", "DELETE /v1/chunks/", "GET /v1/details/",
          "GET /v1/documents/", "DELETE /v1/documents/", "DELETE /v1/knowledge/chunks/", "GET /v1/models/"]

PASSAGE = "The lighthouse at Port Elwen was designed by Margaret Ellison and first lit in 1871."
SEEDS = {
    "POST /v1/chat/completions": [
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}],
         "documents": [PASSAGE], "fusion": {"method": "cacheblend", "ratio": 0.3}},
        {"messages": [{"role": "user", "content": "When?"}], "documents": [{"text": PASSAGE}],
         "fusion": {"method": "qcfuse", "options": {"threshold": 0.5}}, "stream": True,
         "stream_options": {"include_usage": True}},
        # At the nesting bound (64 levels in all): mutations that deepen it must get a 400.
        {"messages": [{"role": "user", "content": "q"}],
         "fusion": {"method": "nope", "options": {"a": json.loads("[" * 61 + "]" * 61)}}},
        {"messages": [{"role": "user", "content": "x"}], "fusion": {"method": "epic", "conversation_id": "c",
                                                                     "reorder": True, "chunk_variant": "prefixed"},
         "retrieval": {"k": 2}, "stop": ["\n"], "seed": 7, "temperature": 0.7, "top_p": 0.9},
    ],
    "POST /v1/completions": [{"prompt": "The capital of France is", "max_tokens": 2},
                             {"prompt": ["Hi"], "documents": [PASSAGE], "fusion": {"method": "reuse"}}],
    "POST /v1/chunks": [{"texts": [PASSAGE]}, {"documents": [{"text": "Short."}, "Another."]}],
    "POST /v1/documents": [{"name": "a.txt", "text": PASSAGE},
                           {"name": "b.csv", "text": "name,age\nAda,36\n", "chunk_tokens": 32},
                           {"name": "c.jsonl", "content_base64": "eyJ0ZXh0IjogImhpIn0K"}],
    "POST /v1/retrieve": [{"query": "lighthouse", "k": 2}],
}
PATHS = {"GET /v1/chunks/": ["0123456789abcdef0123456789abcdef"], "DELETE /v1/chunks/": ["..x"],
         "GET /v1/details/": ["chatcmpl-0"], "GET /v1/documents/": ["doc-1"], "DELETE /v1/documents/": ["doc-1"],
         "DELETE /v1/knowledge/chunks/": ["k-1"], "GET /v1/models/": ["SmolLM2"]}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for route, bodies in SEEDS.items():
        for body in bodies:
            data = bytes([ROUTES.index(route)]) + json.dumps(body).encode()
            n += 1
            with open(os.path.join(out, "seed-%02d" % n), "wb") as f:
                f.write(data)
    for route, segments in PATHS.items():
        for seg in segments:
            n += 1
            with open(os.path.join(out, "seed-%02d" % n), "wb") as f:
                f.write(bytes([ROUTES.index(route)]) + seg.encode())


if __name__ == "__main__":
    main()
