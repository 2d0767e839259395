// The web app's server side (issue 12): chunking by paragraph within a token budget, text out
// of each upload format (PDF through poppler's pdftotext), and the knowledge base against the
// real model: precompute, BM25 retrieval, deletion, and the per-request detail built from a
// real fused completion.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "model/tokenizer.h"
#include "serve/chunk_registry.h"
#include "serve/engine.h"
#include "serve/chunking.h"
#include "serve/document_text.h"
#include "serve/fusion_trace.h"
#include "serve/knowledge_base.h"
#include "serve/knowledge_base_file.h"
#include "serve/knowledge_routes.h"
#include "test_support.h"

namespace cf {
namespace {

namespace fs = std::filesystem;

size_t words(std::string_view s) {  // a stand-in tokenizer: one token per word
  size_t n = 0;
  bool in = false;
  for (char c : s) {
    const bool sp = c == ' ' || c == '\n' || c == '\t';
    if (!sp && !in) ++n;
    in = !sp;
  }
  return n;
}

TEST(Chunking, MergesParagraphsWithinTheBudget) {
  const std::string text = "one two three.\n\nfour five.\n  \nsix seven eight nine.\n\n\n\nten.";
  const auto c = split_into_chunks(text, 5, words);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0], "one two three.\n\nfour five.");  // 3 + 2 fits in 5
  EXPECT_EQ(c[1], "six seven eight nine.\n\nten.");  // 4 + 1 too; a blank line of spaces splits
  EXPECT_EQ(split_into_chunks(text, 4, words).size(), 4u);  // no two paragraphs fit in 4
  EXPECT_EQ(split_into_chunks(text, 100, words).size(), 1u);
  EXPECT_TRUE(split_into_chunks("  \n\n \n", 10, words).empty());
}

TEST(Chunking, CutsLongParagraphsAtSentencesThenWords) {
  const std::string text = "a b c. d e f. g h i j k l m n o p.";
  const auto c = split_into_chunks(text, 4, words);
  for (const auto& x : c) EXPECT_LE(words(x), 4u) << x;
  std::string joined;
  for (const auto& x : c) joined += (joined.empty() ? "" : " ") + x;
  EXPECT_EQ(joined, text);  // nothing lost, nothing reordered
}

TEST(Chunking, FirstSentenceIsTheSummary) {
  EXPECT_EQ(first_sentence("  The river is long. It is wide."), "The river is long.");
  EXPECT_EQ(first_sentence("Title line\n\nBody."), "Title line");
  const std::string s = first_sentence(std::string(300, 'x'), 10);
  EXPECT_EQ(s, std::string(10, 'x') + "\xE2\x80\xA6");
  EXPECT_EQ(first_sentence("\xC3\xA9\xC3\xA9\xC3\xA9", 3), "\xC3\xA9\xE2\x80\xA6");  // not inside a character
}

TEST(DocumentText, FormatsByExtension) {
  EXPECT_EQ(document_format("a.TXT"), "txt");
  EXPECT_EQ(document_format("notes.md"), "md");
  EXPECT_EQ(document_format("x.pdf"), "pdf");
  EXPECT_EQ(document_format("x.jsonl"), "jsonl");
  EXPECT_EQ(document_format("x.xlsx"), "");
  EXPECT_EQ(document_format("noext"), "");
}

int status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const RequestError& e) {
    return e.status;
  }
  return 0;
}

// Issue 29, items 1 and 2: uploads. A nested .jsonl line is refused; every format's text is capped,
// the CSV whose header repeats per row included (it asked for terabytes).
TEST(DocumentText, TextIsBoundedInEveryFormat) {
  EXPECT_EQ(status_of([] { extract_document_text("jsonl", "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}\n"); }), 400);
  ExtractOptions small;
  small.max_text_bytes = 1 << 20;
  std::string csv = std::string(100000, 'h') + "\n";
  for (int i = 0; i < 20; ++i) csv += "x\n";  // 20 rows x 100 KB of header = 2 MB of text
  EXPECT_EQ(status_of([&] { extract_document_text("csv", csv, small); }), 413);
  std::string jsonl;
  for (int i = 0; i < 40; ++i) jsonl += "{\"text\": \"" + std::string(30000, 'y') + "\"}\n";
  EXPECT_EQ(status_of([&] { extract_document_text("jsonl", jsonl, small); }), 413);
  EXPECT_EQ(status_of([&] { extract_document_text("txt", std::string((1 << 20) + 1, 'z'), small); }), 413);
  // Under the cap, the same shapes are extracted as before.
  EXPECT_EQ(extract_document_text("csv", "name,age\nAda,36\n", small), "name: Ada; age: 36\n\n");
  EXPECT_EQ(extract_document_text("txt", "plain", small), "plain");
}

TEST(DocumentText, CsvAndJsonlBecomeParagraphs) {
  EXPECT_EQ(extract_document_text("csv", "name,city\nAda,\"London, UK\"\n\nBob,Paris\n"),
            "name: Ada; city: London, UK\n\nname: Bob; city: Paris\n\n");
  EXPECT_EQ(extract_document_text("jsonl", "{\"title\":\"T\",\"text\":\"body\"}\n\"plain\"\n{\"n\":1}\n"),
            "T\nbody\n\nplain\n\n{\"n\":1}\n\n");
  EXPECT_EQ(status_of([] { extract_document_text("jsonl", "{not json\n"); }), 400);
}

TEST(DocumentText, BadInputGetsClearErrors) {
  EXPECT_EQ(status_of([] { extract_document_text("txt", ""); }), 400);
  EXPECT_EQ(status_of([] { extract_document_text("txt", std::string("a\0b", 3)); }), 400);
  EXPECT_EQ(status_of([] { extract_document_text("md", "\xff\xfe"); }), 400);
  EXPECT_EQ(status_of([] { extract_document_text("docx", "hello"); }), 415);
  EXPECT_EQ(status_of([] { extract_document_text("pdf", "not a pdf at all"); }), 400);
  ExtractOptions missing;
  missing.pdftotext = "/nonexistent/pdftotext";
  EXPECT_EQ(status_of([&] { pdf_to_text("%PDF-1.4\n", missing); }), 503);
}

// A one-page PDF with one line of text (objects, then the xref of their offsets).
std::string tiny_pdf(const std::string& line) {
  const std::string content = "BT /F1 12 Tf 50 700 Td (" + line + ") Tj ET";
  const std::vector<std::string> objs = {
      "<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
      "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
      "<< /Length " + std::to_string(content.size()) + " >>\nstream\n" + content + "\nendstream",
      "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"};
  std::string out = "%PDF-1.4\n";
  std::vector<size_t> offsets;
  for (size_t i = 0; i < objs.size(); ++i) {
    offsets.push_back(out.size());
    out += std::to_string(i + 1) + " 0 obj\n" + objs[i] + "\nendobj\n";
  }
  const size_t xref = out.size();
  out += "xref\n0 " + std::to_string(objs.size() + 1) + "\n0000000000 65535 f \n";
  for (size_t o : offsets) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%010zu 00000 n \n", o);
    out += buf;
  }
  out += "trailer\n<< /Size " + std::to_string(objs.size() + 1) + " /Root 1 0 R >>\nstartxref\n" + std::to_string(xref) +
         "\n%%EOF\n";
  return out;
}

bool have_pdftotext() { return std::system("command -v pdftotext >/dev/null 2>&1") == 0; }

TEST(DocumentText, PdfThroughPdftotext) {
  if (!have_pdftotext()) GTEST_SKIP() << "pdftotext (poppler-utils) is not installed; scripts/setup.sh installs it";
  const std::string text = extract_document_text("pdf", tiny_pdf("The lighthouse was built in 1887."));
  EXPECT_NE(text.find("The lighthouse was built in 1887."), std::string::npos) << text;
  // Damaged after the header: pdftotext fails, a 400 says so.
  EXPECT_EQ(status_of([] { extract_document_text("pdf", "%PDF-1.4\ngarbage garbage"); }), 400);
}

TEST(KnowledgeBaseFile, RoundTripsAndRefusesDamage) {
  SavedKnowledgeBase kb;
  kb.next_document = 3;
  kb.documents.push_back({"doc-000003", "a.txt", "txt", 12, 200, 1700000000, {}});
  kb.documents[0].chunks.push_back({"doc-000003-0", "Hello there.", "Hello there.", "0011", "abcd", "ready", "", 0, 3, 7});
  const std::string text = knowledge_base_file_text(kb);
  const SavedKnowledgeBase back = parse_knowledge_base_file(text, {10, 10});
  ASSERT_EQ(back.documents.size(), 1u);
  ASSERT_EQ(back.documents[0].chunks.size(), 1u);
  EXPECT_EQ(back.next_document, 3u);
  EXPECT_EQ(back.documents[0].chunks[0].text, "Hello there.");
  EXPECT_EQ(back.documents[0].chunks[0].uses, 7u);
  EXPECT_EQ(knowledge_base_file_text(back), text);

  auto refused = [](const std::string& t, const std::string& why) {
    try {
      parse_knowledge_base_file(t, {10, 10});
      ADD_FAILURE() << "accepted: " << t;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(text.substr(0, text.size() / 2), "parse");
  refused(R"({"version": 2, "next_document": 0, "documents": []})", "version 2");
  refused(R"([1, 2])", "not a JSON object");
  std::string twice = text;  // the same document twice
  const auto docs = twice.find("[{");
  const std::string doc = text.substr(docs + 1, text.rfind("]") - docs - 1);
  twice.insert(text.rfind("]"), "," + doc);
  refused(twice, "repeated");
  EXPECT_THROW(parse_knowledge_base_file(text, {0, 10}), std::runtime_error);  // over the limits
  EXPECT_THROW(parse_knowledge_base_file(text, {10, 0}), std::runtime_error);
}

std::string store_dir() {
  static const std::string d = [] {
    auto p = fs::temp_directory_path() / ("cf_kb_test_" + std::to_string(::getpid()));
    fs::remove_all(p);
    return p.string();
  }();
  return d;
}

Engine& engine() {
  static Engine e([] {
    EngineOptions o;
    o.model_path = test::default_model_path();
    o.threads = 2;
    o.cache_dir = store_dir();
    return o;
  }());
  return e;
}

TEST(KnowledgeBaseSlow, PrecomputesRetrievesAndDeletes) {
  CF_REQUIRE_MODEL();
  KnowledgeBase kb(engine());
  const std::string text =
      "The Zorblat river flows through Quenton. It is purple.\n\n"
      "Quenton exports copper wire every spring.\n\nThe Velmora lighthouse was built in 1887.";
  const auto doc = kb.add_document("q.md", "md", text, 16);
  EXPECT_EQ(doc["n_chunks"], 3u);
  kb.wait_idle();
  const auto d = kb.document(doc["id"]);
  ASSERT_TRUE(d);
  EXPECT_EQ((*d)["status"], "ready");
  for (const auto& c : (*d)["chunks"]) {
    EXPECT_EQ(c["state"], "ready");
    EXPECT_EQ(c["cache"], "disk");  // written through to the store's files
    ASSERT_TRUE(engine().chunk(c["cache_id"]));
  }
  const auto hits = kb.retrieve("When was the lighthouse built?", 2);
  ASSERT_FALSE(hits.empty());
  EXPECT_NE(hits[0].text.find("Velmora"), std::string::npos);
  EXPECT_GT(hits[0].score, 0);
  kb.note_used(hits);
  EXPECT_EQ(kb.document(doc["id"]).value()["chunks"][2]["uses"], 1u);

  const std::string first_cache = (*d)["chunks"][0]["cache_id"];
  EXPECT_TRUE(kb.remove_chunk((*d)["chunks"][0]["id"]));
  EXPECT_FALSE(engine().chunk(first_cache));  // its cache went with it
  EXPECT_EQ(kb.document(doc["id"]).value()["n_chunks"], 2u);
  EXPECT_TRUE(kb.remove_document(doc["id"]));
  EXPECT_FALSE(kb.document(doc["id"]));
  EXPECT_FALSE(kb.remove_document(doc["id"]));
  EXPECT_TRUE(kb.retrieve("lighthouse", 3).empty());
}

// Issue 59: every store has a budget a user can see. The knowledge base's three (serve
// --kb-max-documents, --kb-max-chunks, --kb-max-text) each refuse an upload with 409 naming
// the flag, nothing changed; the text count follows deletions, so a delete makes room again.
TEST(KnowledgeBaseSlow, EachLimitRefusesAnUploadAndADeleteMakesRoom) {
  CF_REQUIRE_MODEL();
  const std::string dir = store_dir() + "-limits";
  fs::remove_all(dir);
  EngineOptions eo;
  eo.model_path = test::default_model_path();
  eo.threads = 2;
  eo.cache_dir = dir;
  Engine e(eo);
  KnowledgeBaseOptions o;
  o.limits = {2, 3, 200};
  KnowledgeBase kb(e, o);
  auto refusal = [&](const std::string& text, size_t chunk_tokens) -> std::string {
    try {
      kb.add_document("x.md", "md", text, chunk_tokens);
    } catch (const RequestError& err) {
      EXPECT_EQ(err.status, 409) << err.what();
      return err.what();
    }
    return "accepted";
  };
  const std::string a = "The Zorblat river flows through Quenton.";  // 40 bytes, one chunk
  const std::string a_id = kb.add_document("a.md", "md", a, 0)["id"];
  const std::string three_chunks =
      "The Zorblat river flows through Quenton. It is purple.\n\n"
      "Quenton exports copper wire every spring.\n\nThe Velmora lighthouse was built in 1887.";
  EXPECT_NE(refusal(three_chunks, 16).find("--kb-max-chunks"), std::string::npos);  // 1 + 3 > 3
  EXPECT_NE(refusal(std::string(170, 'w'), 2048).find("--kb-max-text"), std::string::npos);  // 40 + 170 > 200
  kb.add_document("d.md", "md", "The Kestrel bridge is made of oak.", 0);
  EXPECT_NE(refusal("Quenton exports copper wire.", 0).find("--kb-max-documents"), std::string::npos);
  EXPECT_EQ(kb.list_documents()["data"].size(), 2u);  // the refusals changed nothing
  ASSERT_TRUE(kb.remove_document(a_id));
  EXPECT_EQ(refusal("Quenton exports copper wire.", 0), "accepted");
  EXPECT_NE(refusal(std::string(140, 'w'), 2048).find("--kb-max-documents"), std::string::npos);
  ASSERT_TRUE(kb.remove_document(kb.list_documents()["data"][0]["id"]));
  EXPECT_EQ(refusal(std::string(130, 'w'), 2048), "accepted");  // 34 or 28 + 130: A's 40 bytes were given back
  kb.wait_idle();
}

// Issue 59: the request details GET /v1/details/{id} serves are bounded in bytes as well
// as in count (one holds a piece per prompt token): with room for about 2.5 of these 1 MiB
// answers, the oldest are forgotten and the newest kept; one larger than all of it is still
// kept, alone.
TEST(KnowledgeBaseSlow, RequestDetailsStayWithinTheirByteBudget) {
  CF_REQUIRE_MODEL();
  const std::string dir = store_dir() + "-details";
  fs::remove_all(dir);
  EngineOptions eo;
  eo.model_path = test::default_model_path();
  eo.threads = 2;
  eo.cache_dir = dir;
  Engine e(eo);
  KnowledgeServiceOptions o;
  o.kept_details_bytes = (size_t{5} << 20) / 2;
  KnowledgeService service(e, o, [](const httplib::Request&) { return -1; });
  CompletionRequest req;
  CompletionResult r;
  r.text = std::string(size_t{1} << 20, 'x');
  for (int i = 0; i < 5; ++i) service.after_completion("d" + std::to_string(i), -1, req, r, {}, nullptr);
  EXPECT_FALSE(service.detail("d0", -1));
  EXPECT_FALSE(service.detail("d2", -1));
  EXPECT_TRUE(service.detail("d3", -1));
  ASSERT_TRUE(service.detail("d4", -1));
  EXPECT_EQ(service.detail("d4", -1)->at("answer"), r.text);
  EXPECT_FALSE(service.detail("d4", 0)) << "another key's detail";
  r.text = std::string(size_t{3} << 20, 'y');
  service.after_completion("big", -1, req, r, {}, nullptr);
  EXPECT_TRUE(service.detail("big", -1));
  EXPECT_FALSE(service.detail("d4", -1));
}

// Issue 59: a store write that fails (here the chunk index cannot be renamed into place: a
// folder holds its name) changes nothing in memory, and the knowledge base's worker survives
// it, counts it and retries later instead of marking the chunk failed (or, for an exception
// outside its try, ending the process).
TEST(KnowledgeBaseSlow, ARefusedIndexWriteChangesNothingAndTheWorkerRetries) {
  CF_REQUIRE_MODEL();
  const std::string dir = store_dir() + "-refused";
  fs::remove_all(dir);
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.threads = 2;
  o.cache_dir = dir;
  Engine e(o);
  fs::create_directories(dir + "/serve-chunks.json/blocker");  // rename(2) onto it: EISDIR
  const std::string text = "The Kestrel bridge is made of oak.";
  try {
    e.register_chunks({text});
    ADD_FAILURE() << "the registration was not refused";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.status, 503) << err.what();
  }
  EXPECT_TRUE(e.registry().texts().empty());  // write, then commit: nothing registered

  KnowledgeBase kb(e);
  const std::string id = kb.add_document("k.txt", "txt", text, 0)["id"];
  auto state = [&] { return kb.document(id).value()["chunks"][0]["state"].get<std::string>(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (kb.background_failures() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(kb.background_failures(), 1u);
  EXPECT_EQ(state(), "queued");  // waiting for its retry, not failed
  EXPECT_TRUE(e.registry().texts().empty());

  fs::remove_all(dir + "/serve-chunks.json");  // the fault is gone: the retry registers it
  while (state() != "ready" && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(state(), "ready");
  EXPECT_EQ(e.registry().texts(), std::vector<std::string>{text});
  EXPECT_TRUE(fs::is_regular_file(dir + "/serve-chunks.json"));
}

// Issue 59: knowledge-base work grew with its whole size. Each retrieval rebuilt BM25 over
// every chunk, and each completion that used retrieved chunks rewrote and fsynced
// knowledge-base.json (the use counts). Now the index is kept and updated on add and delete,
// and the use counts are saved at most once a second, batched, by the worker.
TEST(KnowledgeBaseSlow, RetrievalAndUseCountsDoNotRewriteOrRebuildPerRequest) {
  CF_REQUIRE_MODEL();
  const std::string dir = store_dir() + "-work";
  fs::remove_all(dir);
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.threads = 2;
  o.cache_dir = dir;
  Engine e(o);
  uint64_t writes = 0;
  {
    KnowledgeBase kb(e);
    const std::string text =
        "The Zorblat river flows through Quenton. It is purple.\n\n"
        "Quenton exports copper wire every spring.\n\nThe Velmora lighthouse was built in 1887.";
    kb.add_document("q.md", "md", text, 16);
    kb.wait_idle();
    const uint64_t builds = kb.bm25_builds();
    writes = kb.file_writes();
    for (int i = 0; i < 20; ++i) {
      const auto hits = kb.retrieve("When was the lighthouse built?", 2);
      ASSERT_FALSE(hits.empty());
      EXPECT_NE(hits[0].text.find("Velmora"), std::string::npos);
      kb.note_used(hits);
    }
    EXPECT_EQ(kb.bm25_builds(), builds) << "20 retrievals";
    EXPECT_LE(kb.file_writes(), writes + 1) << "20 completions' use counts";
    kb.note_used({});  // nothing used: nothing changed
    // The counts reach the file (here: at the latest when the knowledge base closes).
  }
  std::ifstream in(dir + "/knowledge-base.json");
  const auto saved = nlohmann::json::parse(in);
  uint64_t uses = 0;
  for (const auto& d : saved["documents"])
    for (const auto& c : d["chunks"]) uses += c.value("uses", 0);
  EXPECT_EQ(uses, 40u);  // 20 completions, 2 chunks each
  KnowledgeBase reopened(e);
  EXPECT_FALSE(reopened.retrieve("lighthouse", 1).empty());  // the index is built from the file too
  // A deleted document leaves the index with it.
  EXPECT_TRUE(reopened.remove_document(reopened.list_documents()["data"][0]["id"]));
  EXPECT_TRUE(reopened.retrieve("lighthouse", 3).empty());
}

TEST(KnowledgeBaseSlow, DetailMatchesTheFusedCompletion) {
  CF_REQUIRE_MODEL();
  CompletionRequest req;
  req.messages = {{"user", "What does Quenton export?"}};
  req.documents = {{"Quenton exports copper wire every spring, down the purple river.", ""},
                   {"The Velmora lighthouse was built in 1887 on the northern cape.", ""}};
  req.fusion.options.method = "qcfuse";
  req.fusion.options.ratio = 0.3;
  req.max_tokens = 4;
  const CompletionResult r = engine().complete(req);
  ASSERT_TRUE(r.trace);
  const auto d = request_detail_json("x", req, r, {}, engine().tokenizer());
  ASSERT_EQ(d["chunks"].size(), 2u);
  size_t context = 0, rec = 0;
  for (const auto& c : d["chunks"]) {
    context += c["tokens"].size();
    rec += c["recomputed"].size();
    ASSERT_EQ(c["scores"].size(), c["tokens"].size());  // QCFuse's per-token scores
    for (const auto& i : c["recomputed"]) EXPECT_LT(i.get<size_t>(), c["tokens"].size());
  }
  EXPECT_EQ(rec, r.recomputed_tokens);
  EXPECT_EQ(d["recomputed_tokens"], r.recomputed_tokens);
  EXPECT_EQ(rec, static_cast<size_t>(0.3 * static_cast<double>(context)));
  // The token pieces spell the chunk's text back.
  std::string spelled;
  for (const auto& p : d["chunks"][0]["tokens"]) spelled += p.get<std::string>();
  EXPECT_NE(spelled.find("Quenton exports copper wire"), std::string::npos) << spelled;
  EXPECT_GT(d["n_layers"].get<int>(), 0);

  req.fusion.options.method = "full";
  const CompletionResult full = engine().complete(req);
  const auto df = request_detail_json("y", req, full, {}, engine().tokenizer());
  EXPECT_EQ(df["recomputed_tokens"], df["context_tokens"]);
}

}  // namespace
}  // namespace cf
