#!/usr/bin/env python3
"""Seed inputs for fuzz/request_plan_fuzz.cpp: http_request_fuzz's seeds, whose first byte's
parity picks chat (even) or completions (odd) there, as routes 0 and 1 are in http_request.

Usage: python3 tools/make_request_plan_seeds.py OUT_DIR
"""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_http_request_seeds.py"),
                   run_name="__main__")
