"""Every `chunkfuse` subcommand run as a process, as a user runs it (issue 24, item 4): the
real binary on the real SmolLM2 model and real files, asserting on what it prints, the files
it writes and its exit code, for good arguments and bad ones. `serve` is the e2e suite's
(tests/serve_e2e).

Run by ctest as `cli_py` (CHUNKFUSE_BIN names the binary of that build tree, so the ASan tree
runs its own); by hand: CHUNKFUSE_BIN=build/chunkfuse python3 -m unittest discover -s tests/cli
"""
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("CHUNKFUSE_BIN", os.path.join(REPO, "build", "chunkfuse"))
PASSAGES = os.path.join(REPO, "examples", "passages.jsonl")
QUESTION = "Who designed the lighthouse near Port Elwen, and when was it first lit?"


def model_path():
    # The unit tests' model (tests/test_support.cpp): SmolLM2, small enough for every command.
    if os.environ.get("CHUNKFUSE_TEST_MODEL"):
        return os.environ["CHUNKFUSE_TEST_MODEL"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    return os.path.join(cache, "chunkfuse", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


MODEL = model_path()


def run(*args, timeout=300):
    """(exit code, stdout, stderr) of `chunkfuse ARGS`."""
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class CliCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(MODEL):
            raise AssertionError("missing model %s (scripts/setup.sh fetches it)" % MODEL)
        cls.tmp = tempfile.mkdtemp(prefix="chunkfuse-cli-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ok(self, *args, **kw):
        code, out, err = run(*args, **kw)
        self.assertEqual(code, 0, "chunkfuse %s failed:\n%s" % (" ".join(args), err[-2000:]))
        return out, err

    def refused(self, *args, message):
        """The command exits non-zero and says `message` (on stderr), never a crash."""
        code, out, err = run(*args)
        self.assertNotEqual(code, 0, out)
        self.assertLess(code, 128, "killed by a signal:\n" + err[-2000:])
        self.assertIn(message, err)


class InfoGenerateTest(CliCase):
    def test_info(self):
        out, _ = self.ok("info", MODEL)
        self.assertIn("architecture:  llama", out)
        self.assertIn("GGUF version:  3", out)
        self.assertIn("block_count = 30", out)
        out, _ = self.ok("info", "--tensors", MODEL)
        self.assertIn("token_embd.weight", out)
        self.assertIn("blk.29.ffn_down.weight", out)
        not_gguf = os.path.join(self.tmp, "notes.gguf")
        with open(not_gguf, "w") as f:
            f.write("plain text, not a model\n")
        self.refused("info", not_gguf, message="not a GGUF file")
        self.refused("info", os.path.join(self.tmp, "missing.gguf"), message="missing.gguf")

    def test_generate_is_greedy_and_deterministic(self):
        args = ("generate", "-m", MODEL, "-t", "1", "-p", "The capital of France is", "-n", "6", "--temp", "0")
        first, err = self.ok(*args)
        self.assertTrue(first.strip(), err)
        self.assertIn("prefill", err)
        second, _ = self.ok(*args)
        self.assertEqual(first, second)
        self.refused("generate", "-m", MODEL, "-p", "Hi", "-n", "-1", message="--n-predict")
        self.refused("generate", "-m", os.path.join(self.tmp, "none.gguf"), "-p", "Hi", message="none.gguf")


class PerfTest(CliCase):
    def test_perf_json_schema(self):
        out, _ = self.ok("perf", "-m", MODEL, "-t", "1", "--prompt-tokens", "16", "--prompt-tokens", "24",
                         "--gen-tokens", "3", "--decode-context", "16", "--json")
        j = json.loads(out)
        self.assertEqual(j["threads"], 1)
        self.assertIn(j["isa"], ["portable", "avx2", "avx512", "amx"])
        self.assertEqual([p["n_tokens"] for p in j["prefill"]], [16, 24])
        for p in j["prefill"]:
            self.assertGreater(p["seconds"], 0)
            self.assertAlmostEqual(p["tok_per_s"], p["n_tokens"] / p["seconds"], delta=p["tok_per_s"] * 1e-6)
        self.assertEqual((j["decode"]["n_tokens"], j["decode"]["context"]), (3, 16))
        self.assertGreater(j["rss_peak_bytes"], 50 << 20)  # the model is in memory
        self.refused("perf", "-m", MODEL, "--gen-tokens", "-5", message="--gen-tokens")


class AskTest(CliCase):
    def test_ask_reports_the_fused_prefill(self):
        store = os.path.join(self.tmp, "ask-store")
        args = ("ask", "-m", MODEL, "-t", "1", "--passages", PASSAGES, "-q", QUESTION, "--method", "cacheblend",
                "--ratio", "0.2", "-n", "8", "--store", store, "--json")
        j = json.loads(self.ok(*args)[0])
        self.assertEqual((j["method"], j["ratio"]), ("cacheblend", 0.2))
        self.assertTrue(j["answer"].strip())
        self.assertEqual((j["chunk_hits"], j["chunk_misses"]), (0, 5))  # examples/passages.jsonl: 5 passages
        pos = j["recomputed_positions"]
        self.assertEqual(pos, sorted(set(pos)))
        # Cache slots of the context: after the system prefix, before the question.
        self.assertTrue(all(0 < p < j["prompt_tokens"] for p in pos))
        self.assertLess(pos[-1] - pos[0], j["context_tokens"])
        # CacheBlend recomputes ceil-ish 20% of the context tokens, not all and not none.
        self.assertAlmostEqual(len(pos) / j["context_tokens"], 0.2, delta=0.02)
        again = json.loads(self.ok(*args)[0])
        self.assertEqual((again["chunk_hits"], again["chunk_misses"]), (5, 0))  # the store kept them
        self.assertEqual(again["answer"], j["answer"])
        full = json.loads(self.ok("ask", "-m", MODEL, "-t", "1", "--passages", PASSAGES, "-q", QUESTION,
                                  "--method", "full", "-n", "8", "--store", store, "--json")[0])
        self.assertEqual(full["method"], "full")
        self.refused("ask", "-m", MODEL, "--passages", PASSAGES, "-q", "x", "--method", "nope",
                     message="unknown fusion method 'nope'")
        self.refused("ask", "-m", MODEL, "--passages", PASSAGES, "-q", "x", "--ratio", "2", message="--ratio")
        bad = os.path.join(self.tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"title": "a", "text": "fine"}\n{not json\n')
        self.refused("ask", "-m", MODEL, "--passages", bad, "-q", "x", message="bad.jsonl:2: not valid JSON")


class ChunksTest(CliCase):
    def test_precompute_ls_verify_rm(self):
        root = os.path.join(self.tmp, "chunks")
        store = os.path.join(root, "store")
        os.makedirs(root)
        bystander = os.path.join(root, "keep.cfkv")  # a file beside the store that rm must never touch
        with open(bystander, "w") as f:
            f.write("not ours")
        out, _ = self.ok("chunks", "precompute", "-m", MODEL, "-t", "1", "--passages", PASSAGES, "--store", store)
        self.assertIn("chunks 5: computed 5, already stored 0", out)
        out, _ = self.ok("chunks", "precompute", "-m", MODEL, "-t", "1", "--passages", PASSAGES, "--store", store)
        self.assertIn("computed 0, already stored 5", out)
        out, _ = self.ok("chunks", "ls", "--store", store)
        ids = [line.split()[0] for line in out.splitlines()[1:] if len(line.split()) > 1 and len(line.split()[0]) == 32]
        self.assertEqual(len(ids), 5, out)
        self.assertIn("5 entries", out)
        out, _ = self.ok("chunks", "verify", "--store", store, "-m", MODEL)
        self.assertIn("5 valid", out)
        # Damage one entry's body: verify names it and fails.
        victim = os.path.join(store, ids[0][:2], ids[0] + ".cfkv")
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            f.write(b"\xff\xfe\xfd\xfc")
        code, out, err = run("chunks", "verify", "--store", store, "-m", MODEL)
        self.assertEqual(code, 1, out + err)
        self.assertIn("BAD", out + err)
        self.assertIn(ids[0], out + err)
        self.assertIn("4 valid", out + err)
        # rm refuses anything that is not an id, outside the store included.
        for bad in ["../keep", "../../etc", ids[0].upper(), ids[0][:-1]]:
            code, out, err = run("chunks", "rm", "--store", store, bad)
            self.assertEqual(code, 1, out + err)
            self.assertIn("not a chunk id", out + err)
        self.assertTrue(os.path.isfile(bystander))
        out, _ = self.ok("chunks", "rm", "--store", store, ids[0])
        self.assertIn("removed 1 entries", out)
        out, _ = self.ok("chunks", "verify", "--store", store, "-m", MODEL)
        self.assertIn("4 valid", out)
        out, _ = self.ok("chunks", "rm", "--store", store, "--all")
        self.assertIn("removed 4 entries", out)
        self.assertIn("0 entries", self.ok("chunks", "ls", "--store", store)[0])
        self.assertTrue(os.path.isfile(bystander))


def tiny_dataset(path):
    """Two questions over examples/passages.jsonl, in the user JSON Lines format of `bench`."""
    with open(PASSAGES) as f:
        passages = [json.loads(line) for line in f if line.strip()]
    rows = [{"id": "q1", "question": QUESTION, "answers": ["Margaret Hale"], "passages": passages},
            {"id": "q2", "question": "When was the lighthouse first lit?", "answers": ["1868"],
             "passages": passages[::-1]}]
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


class BenchDeviationProfileTest(CliCase):
    def test_bench_rows(self):
        data = os.path.join(self.tmp, "tiny.jsonl")
        tiny_dataset(data)
        out_dir = os.path.join(self.tmp, "bench")
        self.ok("bench", "-m", MODEL, "-t", "1", "--data", data, "--methods", "full,reuse,epic", "--ratios", "0.15",
                "-n", "6", "--memory-store", "--no-report", "--out", out_dir)
        with open(os.path.join(out_dir, "results.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        self.assertEqual(sorted((r["example"], r["method"]) for r in rows),
                         sorted((e, m) for e in ["q1", "q2"] for m in ["full", "reuse", "epic"]))
        for r in rows:
            for key in ["answer", "f1", "em", "fidelity_f1", "kl", "ttft_ms", "context_tokens", "ratio"]:
                self.assertIn(key, r)
            self.assertGreaterEqual(r["kl"], 0.0)
            self.assertTrue(0.0 <= r["f1"] <= 1.0 and 0.0 <= r["fidelity_f1"] <= 1.0)
            if r["method"] == "full":
                self.assertEqual((r["fidelity_f1"], r["kl"]), (1.0, 0.0))
                self.assertEqual(r["answer"], r["full_answer"])
        # Resumable: the same command adds nothing.
        stdout, err = self.ok("bench", "-m", MODEL, "-t", "1", "--data", data, "--methods", "full,reuse,epic",
                              "--ratios", "0.15", "-n", "6", "--memory-store", "--no-report", "--out", out_dir)
        self.assertIn("0 rows written, 6 already present", stdout + err)
        self.refused("bench", "-m", MODEL, "--data", data, "--methods", "nope", "--out", out_dir, message="nope")
        # bench_command.txt is a command a shell runs again, whatever the prompt words hold.
        words = "It's short; say \"no\" $HOME"
        quoted_dir = os.path.join(self.tmp, "bench-quoted")
        self.ok("bench", "-m", MODEL, "-t", "1", "--data", data, "--methods", "full", "-n", "2", "--limit", "1",
                "--memory-store", "--no-report", "--system", words, "--out", quoted_dir)
        with open(os.path.join(quoted_dir, "bench_command.txt")) as f:
            argv = shlex.split(f.read().splitlines()[-1])
        self.assertEqual(argv[argv.index("--system") + 1], words)
        self.refused("bench", "-m", MODEL, "--data", os.path.join(self.tmp, "none.jsonl"), "--out", out_dir,
                     message="none.jsonl")

    def test_deviation_csv(self):
        data = os.path.join(self.tmp, "tiny-dev.jsonl")
        tiny_dataset(data)
        out_dir = os.path.join(self.tmp, "deviation")
        self.ok("deviation", "-m", MODEL, "-t", "1", "--data", data, "--limit", "1", "--methods", "reuse,cacheblend",
                "--ratios", "0,0.15", "--chunk-contexts", "alone", "--no-report", "--out", out_dir)
        with open(os.path.join(out_dir, "deviation.csv")) as f:
            header, *lines = f.read().splitlines()
        self.assertEqual(header, "dataset,example,chunk_context,method,ratio,part,layer,k_rel,v_rel")
        rows = [dict(zip(header.split(","), line.split(","))) for line in lines]
        self.assertTrue(rows)
        self.assertEqual({r["layer"] for r in rows}, {str(i) for i in range(30)})
        for r in rows:
            self.assertGreaterEqual(float(r["k_rel"]), 0.0)
        # Reuse keeps every chunk's cache as computed alone: its deviation past layer 0 is not zero.
        reuse_deep = [float(r["k_rel"]) for r in rows if r["method"] == "reuse" and r["part"] == "context"
                      and int(r["layer"]) > 0]
        self.assertGreater(max(reuse_deep), 0.0)

    def test_profile_layers(self):
        out = os.path.join(self.tmp, "profile.qcfuse.json")
        data_dir = os.environ.get("CHUNKFUSE_DATA_DIR") or os.path.join(REPO, "..", "shared", "datasets")
        stdout, err = self.ok("profile-layers", "-m", MODEL, "-t", "1", "--data-dir", data_dir, "--limit", "1",
                              "--layers", "2", "--out", out)
        with open(out) as f:
            p = json.load(f)
        layers = p["critical_layers"]
        self.assertEqual(len(layers), 2)
        self.assertEqual(len(set(layers)), 2)
        self.assertTrue(all(0 <= l < 30 for l in layers))
        self.assertTrue(0.0 <= p["critical_set_recall"] <= p["all_layers_recall"] <= 1.0)
        self.assertIn("critical layers:", stdout + err)
        # The prompt lengths it was fitted on are recorded, overall and per dataset.
        short = p["data"]["context_tokens"]
        self.assertTrue(0 < short["min"] <= short["median"] <= short["max"] < 4000, short)
        self.assertEqual(sorted(p["data"]["datasets"]), ["hotpotqa", "nq_open_oracle"])
        for d in p["data"]["datasets"].values():
            self.assertTrue(short["min"] <= d["context_tokens"]["median"] <= short["max"])
        self.assertIn("fitted on prompts of %d-%d context tokens" % (short["min"], short["max"]), stdout)
        self.refused("profile-layers", "-m", MODEL, "--data-dir", os.path.join(self.tmp, "no-data"), "--limit", "1",
                     "--out", out, message="no-data")
        # --data: the last --limit examples of any dataset, here musique_s's ~6K-token prompts.
        mus = os.path.join(self.tmp, "musique.qcfuse.json")
        self.ok("profile-layers", "-m", MODEL, "-t", "1", "--data-dir", data_dir, "--data", "musique_s",
                "--limit", "1", "--layers", "2", "--out", mus)
        with open(mus) as f:
            m = json.load(f)
        self.assertEqual(list(m["data"]["datasets"]), ["musique_s"])
        self.assertEqual(m["data"]["datasets"]["musique_s"]["lines"], [149], "the last example, held out from bench")
        self.assertEqual(len(m["critical_layers"]), 2)
        long_len = m["data"]["context_tokens"]
        self.assertEqual(long_len, m["data"]["datasets"]["musique_s"]["context_tokens"])
        self.assertEqual(long_len["min"], long_len["max"], "one example")
        self.assertGreater(long_len["median"], 2 * short["max"], "musique_s's prompts are several times longer")
        self.refused("profile-layers", "-m", MODEL, "--data-dir", data_dir, "--data", "no_such_set", "--limit", "1",
                     "--out", mus, message="no_such_set")


class CalibrateTest(CliCase):
    def test_records_fit_evaluate_and_layout_guard(self):
        """`calibrate` records full prefill and every ladder step per example, fits a calibration
        with a plan per target, refits it from the records alone, replays it, and refuses to resume a records file made with other
        RAG words (issue 26)."""
        data = os.path.join(self.tmp, "tiny-cal.jsonl")
        tiny_dataset(data)
        records = os.path.join(self.tmp, "cal.records.jsonl")
        cal = os.path.join(self.tmp, "cal.auto.json")
        self.ok("calibrate", "-m", MODEL, "-t", "1", "--dataset", data, "--first", "0", "--limit", "2",
                "--ladder", "prophet:0.05,epic:0.3", "--max-tokens", "6", "--records", records, "--out", cal)
        with open(records) as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual(len(recs), 2)
        for r in recs:
            self.assertEqual([(s["method"], s["ratio"]) for s in r["steps"]], [("prophet", 0.05), ("epic", 0.3)])
            self.assertTrue(r["prompt_layout"])
            for s in r["steps"]:
                self.assertEqual(s["identical"], s["answer"] == r["full"]["answer"])
                self.assertGreater(s["ttft_ms"], 0.0)
        with open(cal) as f:
            c = json.load(f)
        self.assertEqual(c["provenance"]["prompt_layout"], recs[0]["prompt_layout"])
        # A plan per target: ascending qualities up to 1, where full prefill (no step) serves.
        self.assertEqual(len(c["size_classes"]), 1)  # one plan for every request size unless asked
        policies = c["size_classes"][0]["policies"]
        qualities = [p["quality"] for p in policies]
        self.assertEqual(qualities, sorted(qualities))
        self.assertEqual(qualities[-1], 1.0)
        self.assertEqual(policies[-1]["steps"], [])
        for p in policies:
            self.assertGreaterEqual(min(p["observed_share"], p["expected_share"]), p["quality"] - 1e-9)
        # --fit refits from the records alone (no model), to the same plan.
        refit = os.path.join(self.tmp, "refit.auto.json")
        self.ok("calibrate", "--fit", records, "--out", refit)
        with open(refit) as f:
            self.assertEqual(json.load(f)["size_classes"], c["size_classes"])
        # A plan per size class needs records in each class: two records cannot plan two.
        self.refused("calibrate", "--fit", records, "--size-classes", "1", "--out", refit, message="are needed to plan it")
        report = os.path.join(self.tmp, "cal.report.json")
        self.ok("calibrate", "--evaluate", records, "--calibration", cal, "--report", report, "--targets", "0.9")
        with open(report) as f:
            rep = json.load(f)
        self.assertEqual(rep["examples"], 2)
        self.assertEqual(len(rep["perfect_predictor"]["single_step"]), 2)
        # Resuming with other words would mix two layouts in one fit.
        self.refused("calibrate", "-m", MODEL, "-t", "1", "--dataset", data, "--first", "0", "--limit", "2",
                     "--ladder", "prophet:0.05,epic:0.3", "--records", records, "--no-fit", "--system", "Be brief.",
                     message="other RAG prompt words")
        self.refused("calibrate", "-m", MODEL, "--dataset", data, "--ladder", "full:0.5", "--records", records,
                     message="unknown method 'full'")
        # Resuming with other chunking would skip examples recorded as other requests.
        self.refused("calibrate", "-m", MODEL, "-t", "1", "--dataset", data, "--first", "0", "--limit", "2",
                     "--ladder", "prophet:0.05,epic:0.3", "--records", records, "--no-fit", "--chunk-tokens", "64",
                     message="records made another way (chunk_tokens 0, this run 64)")

    def test_answers_cut_inside_a_character_are_recorded(self):
        """An answer cut by --max-tokens in the middle of a multi-byte character is no valid
        UTF-8: the record keeps it with U+FFFD instead of aborting the run (a HotpotQA run on
        SmolLM2 died on a Japanese name at 32 tokens). One token of a CJK answer is mostly such
        a piece: of these 12 answers (6 requests, full prefill and reuse), 8 were."""
        passages = [{"title": "東京", "text": "東京は日本の首都です。東京タワーは東京にあります。"},
                    {"title": "南昌", "text": "南昌會戰是中國抗日戰爭中的一場戰役。"}]
        questions = ["東京は何ですか？", "南昌會戰是什麼？", "日本の首都は？", "東京タワーはどこにありますか？",
                     "Write 東京 in Japanese characters.", "請用中文回答：南昌會戰是什麼？"]
        data = os.path.join(self.tmp, "cjk.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for i, q in enumerate(questions):
                f.write(json.dumps({"id": "c%d" % i, "question": q, "answers": ["東京"], "passages": passages}) + "\n")
        records = os.path.join(self.tmp, "cjk.records.jsonl")
        self.ok("calibrate", "-m", MODEL, "-t", "1", "--dataset", data, "--ladder", "reuse:0", "--max-tokens", "1",
                "--records", records, "--no-fit")
        with open(records, encoding="utf-8") as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual(len(recs), 6)
        answers = [r["full"]["answer"] for r in recs] + [s["answer"] for r in recs for s in r["steps"]]
        self.assertTrue(any("\ufffd" in a for a in answers), answers)

    def test_cross_validation_replays_every_record_with_a_calibration_fitted_without_it(self):
        """`--cross-validate K` on the committed Qwen 0.5B HotpotQA records (no model is run):
        one report over every record, each fold planned by its own calibration, the musique_s
        records only fitted on (a second size class), never replayed."""
        d = os.path.join(REPO, "bench", "results", "issue26_auto_v3")
        hot = [os.path.join(d, "qwen05.hotpotqa%s.records.jsonl" % s) for s in ("0-40", "160-200")]
        mus = [os.path.join(d, "qwen05.musique_s%s.records.jsonl" % s) for s in ("0-16", "16-32")]
        report = os.path.join(self.tmp, "cv.report.json")
        out, _ = self.ok("calibrate", "--cross-validate", "4", "--evaluate", *hot, "--fit", *mus, "--size-classes", "3000",
                         "--targets", "0.8,0.95", "--report", report)
        self.assertIn("each record replayed by a calibration fitted without it (4 folds)", out)
        with open(report) as f:
            rep = json.load(f)
        self.assertEqual(rep["examples"], 80)
        self.assertEqual(rep["datasets"], ["hotpotqa_dev200"])
        self.assertEqual(rep["cross_validation"], {"folds": 4, "fitted_also_on": 32})
        for row in rep["auto"]:
            self.assertEqual(len(row["fold_policies"]), 4)
            self.assertTrue(all(len(plans) == 2 for plans in row["fold_policies"]))
            self.assertEqual(sum(row["chosen"].values()), 80)
            self.assertLessEqual(row["share_low"], row["share"])
        self.refused("calibrate", "--cross-validate", "4", "--evaluate", *hot, "--calibration", report,
                     message="--calibration does not apply")
        self.refused("calibrate", "--evaluate", *hot, "--fit", *mus, "--calibration", report,
                     message="--fit applies with --cross-validate only")
        self.refused("calibrate", "--cross-validate", "81", "--evaluate", *hot, message="81 folds of 80 records")
        self.refused("calibrate", "--cross-validate", "4", "--fit", *hot, message="--cross-validate needs --evaluate")

    def test_records_carry_the_recomputation_kv_change_after_a_reuse_step(self):
        """Behind a reuse step, each later step's record says how far its recomputation moved the
        K/V from the stitched chunk caches, per layer: more recomputed rows, more change; and
        the share of its selector's score mass the recomputed rows hold."""
        data = os.path.join(self.tmp, "tiny-kv.jsonl")
        tiny_dataset(data)
        records = os.path.join(self.tmp, "kv.records.jsonl")
        self.ok("calibrate", "-m", MODEL, "-t", "1", "--dataset", data, "--first", "0", "--limit", "1",
                "--ladder", "reuse:0,epic:0.05,epic:1", "--max-tokens", "4", "--records", records, "--no-fit")
        with open(records) as f:
            (r,) = [json.loads(line) for line in f]
        reuse, low, every = r["steps"]
        self.assertNotIn("kv_change", reuse)
        mean = lambda xs: sum(xs) / len(xs)
        for s in (low, every):
            for part in ("context", "question"):
                for x in ("k", "v"):
                    layers = s["kv_change"][part][x]
                    self.assertEqual(len(layers), 30)  # SmolLM2-135M's layers
                    self.assertTrue(all(v >= 0 for v in layers))
        # Layer 0's K/V depend on the token and its position only: recomputing leaves them.
        self.assertLess(every["kv_change"]["context"]["v"][0], 1e-3)
        self.assertGreater(mean(low["kv_change"]["context"]["v"]), 0.0)
        # (Not proportional: EPIC's 5% are each chunk's first tokens, the attention sinks of a
        # chunk cached alone, whose K/V change most; here 0.19 against 0.35 for every row.)
        self.assertGreater(mean(every["kv_change"]["context"]["v"]), 1.2 * mean(low["kv_change"]["context"]["v"]))
        self.assertGreater(mean(every["kv_change"]["question"]["v"]), 0.0)
        # The selector's own scores: every row recomputed holds all of their mass, 5% less.
        self.assertAlmostEqual(every["scores"]["selected_share"], 1.0)
        self.assertLess(low["scores"]["selected_share"], 0.9)
        self.assertGreater(low["scores"]["selected_share"], 0.0)
        self.assertNotIn("scores", reuse)
        self.assertGreater(r["question_tokens"], 0)


if __name__ == "__main__":
    unittest.main()
